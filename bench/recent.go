package bench

import (
	"math/rand/v2"
	"sync"
)

// recentSize is how many packets the ring remembers. Openers choose among them,
// so it bounds both memory and how far back an opener looks.
const recentSize = 256

// recent is a bounded ring of recently sent packets that senders publish into
// and openers pick from. Every packet gets a sequence number (0, 1, 2, ...) in
// publishing order; the ring holds the last len(slots) of them.
//
// A packet is retired (its slot emptied, so openers stop choosing it) when an
// opener learns it is sold out or expired, or after retireAfter open attempts:
// without that, a packet with more shares than there are openers would stay
// live after every opener had opened it, and senders pacing on liveCount would
// wait forever. recent is safe for concurrent use.
type recent struct {
	mu          sync.Mutex // guards slots, live and next
	slots       []slot     // slots[seq%len(slots)] holds packet seq
	live        int        // slots holding a packet that is not retired
	next        uint64     // sequence number of the next add
	retireAfter int64      // open attempts after which a packet is retired, >= 1
}

type slot struct {
	id       string // packet ID; "" once retired
	attempts int64  // open attempts reported with attempted
}

// newRecent makes a ring of size slots whose packets retire after retireAfter
// open attempts.
func newRecent(size int, retireAfter int64) *recent {
	if size < 1 || retireAfter < 1 {
		panic("bench: recent ring needs size >= 1 and retireAfter >= 1")
	}
	return &recent{slots: make([]slot, size), retireAfter: retireAfter}
}

// add publishes packet id and returns its sequence number. It evicts the oldest
// packet when the ring is full.
func (r *recent) add(id string) uint64 {
	if id == "" {
		panic("bench: empty packet ID")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	seq := r.next
	s := &r.slots[seq%uint64(len(r.slots))]
	if s.id != "" {
		r.live--
	}
	*s = slot{id: id}
	r.live++
	r.next++
	return seq
}

// oldest returns the sequence number of the oldest packet the ring may still
// hold; every smaller one is gone.
func (r *recent) oldest() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.oldestLocked()
}

// oldestLocked is oldest; r.mu must be held.
func (r *recent) oldestLocked() uint64 {
	if n := uint64(len(r.slots)); r.next > n {
		return r.next - n
	}
	return 0
}

// liveCount returns how many packets in the ring are not retired.
func (r *recent) liveCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.live
}

// pick returns a packet still in the ring, not retired, whose sequence number is
// not in skip (the caller's record of what it has opened; pick only reads it).
// It starts at a random slot and walks forward, so it is uniform when nothing
// is skipped. ok is false when no packet qualifies.
func (r *recent) pick(rnd *rand.Rand, skip map[uint64]struct{}) (seq uint64, id string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	first := r.oldestLocked()
	n := r.next - first
	if n == 0 {
		return 0, "", false
	}
	start := rnd.Uint64N(n)
	for i := uint64(0); i < n; i++ {
		s := first + (start+i)%n
		id := r.slots[s%uint64(len(r.slots))].id
		if id == "" {
			continue
		}
		if _, done := skip[s]; done {
			continue
		}
		return s, id, true
	}
	return 0, "", false
}

// slotLocked returns the slot of packet seq, or nil if the ring no longer holds
// it or it is retired; r.mu must be held.
func (r *recent) slotLocked(seq uint64) *slot {
	if seq < r.oldestLocked() || seq >= r.next {
		return nil
	}
	s := &r.slots[seq%uint64(len(r.slots))]
	if s.id == "" {
		return nil
	}
	return s
}

// attempted counts one open attempt on packet seq and retires the packet at
// retireAfter attempts.
func (r *recent) attempted(seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.slotLocked(seq); s != nil {
		s.attempts++
		if s.attempts >= r.retireAfter {
			s.id = ""
			r.live--
		}
	}
}

// retire empties the slot of packet seq if it still holds that packet.
func (r *recent) retire(seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.slotLocked(seq); s != nil {
		s.id = ""
		r.live--
	}
}

// prune deletes from opened every sequence number the ring no longer holds, so
// an opener's record stays bounded by the ring size.
func (r *recent) prune(opened map[uint64]struct{}) {
	first := r.oldest()
	for s := range opened {
		if s < first {
			delete(opened, s)
		}
	}
}
