package cell

import (
	mrand "math/rand/v2"
	"sync/atomic"
	"time"

	"redcell/model"
)

// Credits keep pace with opens. Every open makes a credit, which a relay
// lane books on a database server that opens also use (this cell's, or the
// claimant's cell's), over one connection against the opens' dozens: under
// overload the server's time is shared per connection, and credits fell tens
// of seconds behind while every open was answered. So opens are shed, a
// growing share of them, while the relay is behind with this cell's credits
// (relay.Relay.Behind): none up to Config.CreditShedFrom (400 ms), all from
// Config.CreditShedAll (1 s), in proportion between. What a shed open
// frees goes to the credits; the lane catches up within a batch or two and
// opens are taken again. The credit lag this bounds is the bench's: p99 ≤
// 2 s in every strategy.

// behindFor is how long one reading of Behind is used: it reads the lanes'
// queues under their locks, and opens come by the thousand a second.
const behindFor = 20 * time.Millisecond

// creditShedShare is the share of opens shed when the relay is behind by
// behind: 0 up to from (or always when from is 0), 1 from all, linear
// between.
func creditShedShare(behind, from, all time.Duration) float64 {
	switch {
	case from <= 0 || behind <= from:
		return 0
	case behind >= all:
		return 1
	}
	return float64(behind-from) / float64(all-from)
}

// behindReading is a space's last reading of its relay's Behind.
type behindReading struct {
	at     atomic.Int64 // Unix ns of the reading; 0: none
	behind atomic.Int64 // ns
}

// creditShed answers whether this open is shed because the space's credits
// are behind (creditShedShare of opens are), with the error to answer: the
// retryable OVERLOADED. Counted as a shed open (reason credit_lag). Off
// when Config.CreditShedFrom is 0.
func (s *Server) creditShed(sp *space) error {
	if sp.relay == nil || s.cfg.CreditShedFrom <= 0 {
		return nil
	}
	now := s.clock.Now()
	r := &sp.behind
	behind := time.Duration(r.behind.Load())
	if at := r.at.Load(); at == 0 || now.UnixNano()-at >= int64(behindFor) || now.UnixNano() < at {
		behind = sp.relay.Behind(now)
		r.behind.Store(int64(behind))
		r.at.Store(now.UnixNano())
	}
	share := creditShedShare(behind, s.cfg.CreditShedFrom, s.cfg.CreditShedAll)
	if share == 0 || (share < 1 && mrand.Float64() >= share) {
		return nil
	}
	s.opens.stats.shed.Add(1)
	s.metrics.shed[shedCreditLag].Inc()
	return model.Errorf(model.ErrOverloaded, "credits are %s behind on this cell; opens are shed until they catch up", behind.Round(time.Millisecond))
}
