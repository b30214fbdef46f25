package cell

import (
	"sync/atomic"
	"time"

	"redcell/cell/admission"
	"redcell/internal/clock"
	"redcell/model"
)

// grabCache is the GrabCache as the cell uses it: keyed by space, each copy
// kept until an hour after its packet expires. A nil *grabCache is no cache:
// set does nothing and get misses.
type grabCache struct {
	c         GrabCache
	clock     clock.Clock
	shadowGen atomic.Int64 // the shadow keys' generation: one more per shadow cleanup (key, shadow.go)
}

// set writes the packet's state as a commit (or a refund) left it.
func (g *grabCache) set(sp *space, p model.Packet) {
	if g == nil || p.ID == "" {
		return
	}
	g.c.Set(g.key(sp, p.ID), remainingOf(p), g.ttl(p))
}

// fill writes a state read after a miss, unless something newer is there.
func (g *grabCache) fill(sp *space, p model.Packet) {
	if g == nil {
		return
	}
	g.c.Fill(g.key(sp, p.ID), remainingOf(p), g.ttl(p))
}

// get reads the copy of packet id; ok is false on a miss.
func (g *grabCache) get(sp *space, id model.PacketID) (admission.Remaining, bool) {
	if g == nil {
		return admission.Remaining{}, false
	}
	return g.c.Get(g.key(sp, id))
}

func (g *grabCache) ttl(p model.Packet) time.Duration {
	return time.UnixMilli(p.ExpiresMS).Sub(g.clock.Now()) + time.Hour
}

func remainingOf(p model.Packet) admission.Remaining {
	return admission.Remaining{Count: p.RemainingCount, Status: int8(p.Status), ExpiresMS: p.ExpiresMS}
}
