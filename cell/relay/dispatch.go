package relay

// The relay's lanes as the relay keeps them: credits dispatched to a lane
// per destination, lanes started, listed and retired.

import (
	"time"

	"redcell/model"
)

// dispatch offers each credit to the lane of its destination and returns how
// many no lane took: its lane is full, backing off or stopping, no room is
// left for another lane, or no live cell owns the claimant's shard. The
// relay holds those and offers them again. scanStart is when the read or
// offer that found them began (zero for fresh claims; see lane.offer). It
// never blocks.
func (r *Relay) dispatch(credits []model.Credit, scanStart time.Time) (left int) {
	local, remote, noOwner := r.cfg.Peers.Map().GroupByOwner(credits, r.cfg.Owns)
	if noOwner > 0 {
		r.Stats.Errors.Add(int64(noOwner)) // no live owner now: held, offered again
		left += noOwner
	}
	now := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	offer := func(l *lane, cs []model.Credit) int {
		if l == nil {
			return len(cs)
		}
		return len(cs) - l.offer(cs, now, scanStart)
	}
	if len(local) > 0 {
		left += offer(r.laneLocked("", true), local)
	}
	for _, g := range remote {
		left += offer(r.laneLocked(g.Cell.Name, false), g.Credits)
	}
	return left
}

// laneLocked returns the lane of a destination, starting it if needed; nil
// while the relay stops, or when lanesMax lanes to other cells run. r.mu must
// be held.
func (r *Relay) laneLocked(name string, local bool) *lane {
	if r.stopping {
		return nil
	}
	if local {
		if r.local == nil {
			r.local = r.startLocked(newLane(r, r.cfg.Cell, true))
		}
		return r.local
	}
	if l, ok := r.remote[name]; ok {
		return l
	}
	if len(r.remote) >= lanesMax {
		return nil
	}
	l := r.startLocked(newLane(r, name, false))
	r.remote[name] = l
	return l
}

// startLocked starts l's goroutine. r.mu must be held.
func (r *Relay) startLocked(l *lane) *lane {
	r.lanesWG.Add(1)
	go l.run()
	return l
}

// retire removes l if it holds nothing, so that its goroutine may exit; a
// later credit for its destination starts a new lane.
func (r *Relay) retire(l *lane) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.held) > 0 {
		return false
	}
	l.retired = true
	if l.local {
		r.local = nil
	} else {
		delete(r.remote, l.dest)
	}
	return true
}

// LaneState is what one lane holds and its backoff (the metrics).
type LaneState struct {
	Dest    string        // the destination cell's name
	Local   bool          // the lane of this cell's own claimants
	Held    int           // credits queued, in flight or waiting to be tried again
	Backoff time.Duration // pause after failed deliveries; 0 after a success
}

// Lanes reports the running lanes: at most lanesMax+1.
func (r *Relay) Lanes() []LaneState {
	var out []LaneState
	for _, l := range r.lanes() {
		held, backoff := l.state()
		out = append(out, LaneState{Dest: l.dest, Local: l.local, Held: held, Backoff: backoff})
	}
	return out
}

// lanes returns the running lanes.
func (r *Relay) lanes() []*lane {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*lane, 0, len(r.remote)+1)
	if r.local != nil {
		out = append(out, r.local)
	}
	for _, l := range r.remote {
		out = append(out, l)
	}
	return out
}
