package cell

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/cell/api"
	"redcell/model"
)

// relay delivers claims to the claimants' wallets: at least once from the
// outbox, applied exactly once by the receiving side (the claim ID is the order
// number). Fresh claims come straight from the open workers; a periodic scan of
// the outbox picks up whatever that missed (a crash, a full channel, a peer down).
type relay struct {
	s      *Server
	sp     *space // the namespace whose outbox this relay drains
	in     chan []model.Credit
	client *fasthttp.Client
}

const (
	relayBatchMax = 500
	// relayLinger is how long a delivery waits to fill; it adds at most this much
	// to the time a claimant waits for the credit.
	relayLinger = 20 * time.Millisecond
	// relayTimeout bounds one delivery; the receiving cell gets it as the deadline.
	relayTimeout = 10 * time.Second
)

func newRelay(s *Server, sp *space) *relay {
	return &relay{s: s, sp: sp, in: make(chan []model.Credit, 4096), client: &fasthttp.Client{
		Name: "redcell-relay", ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, MaxConnsPerHost: 16,
	}}
}

// enqueue hands fresh claims to the relay without blocking; when the channel is
// full, or the relay is switched off, they wait in the outbox for a later scan.
func (r *relay) enqueue(credits []model.Credit) {
	if r.s.isDegraded(switchRelay) {
		return
	}
	select {
	case r.in <- credits:
	default:
		r.s.stats.relayDropped.Add(int64(len(credits)))
	}
}

func (r *relay) run(ctx context.Context) {
	t := time.NewTicker(r.s.cfg.RelayInterval)
	defer t.Stop()
	for {
		select {
		case batch := <-r.in:
			if !r.s.isDegraded(switchRelay) { // switched off: the outbox keeps them
				r.deliver(ctx, r.gather(batch))
			}
		case <-t.C:
			if !r.s.isDegraded(switchRelay) {
				r.scan(ctx)
			}
		case <-ctx.Done():
			if !r.s.isDegraded(switchRelay) {
				r.flush()
			}
			return
		}
	}
}

// flush delivers, when the cell stops, what the workers handed over and the
// relay has not delivered yet: all of it gathered first, then sent in calls
// of up to relayBatchMax credits (not one call per open batch), for at most
// 5 s. The outbox keeps whatever is left for the next start's scan.
func (r *relay) flush() {
	var pending []model.Credit
	for drained := false; !drained; {
		select {
		case batch := <-r.in:
			pending = append(pending, batch...)
		default:
			drained = true
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for len(pending) > 0 && ctx.Err() == nil {
		n := min(len(pending), relayBatchMax)
		r.deliver(ctx, pending[:n])
		pending = pending[n:]
	}
}

// gather adds to batch what the workers hand over within relayLinger, up to
// relayBatchMax: under load one delivery (one HTTP call, one transaction on each
// side) carries hundreds of credits instead of one open batch's worth.
func (r *relay) gather(batch []model.Credit) []model.Credit {
	linger := time.NewTimer(relayLinger)
	defer linger.Stop()
	for len(batch) < relayBatchMax {
		select {
		case more := <-r.in:
			batch = append(batch, more...)
		case <-linger.C:
			return batch
		}
	}
	return batch
}

// storagePos is a position in an outbox: after (created ms, claim ID).
type storagePos struct {
	ms int64
	id string
}

// scan re-drives outbox rows older than two relay intervals.
func (r *relay) scan(ctx context.Context) {
	before := r.s.now().Add(-2 * r.s.cfg.RelayInterval).UnixMilli()
	seen := map[int]bool{}
	for _, sh := range r.s.cfg.Shards.Shards() {
		db := sh.DB()
		if seen[db] {
			continue
		}
		seen[db] = true
		// Page through the pending rows by (created_ms, claim_id), so rows that
		// cannot be delivered now (their cell is down) do not hide newer ones.
		var after storagePos
		for page := 0; page < 10 && ctx.Err() == nil; page++ {
			credits, next, err := r.sp.store.PendingCredits(ctx, db, before, after.ms, after.id, relayBatchMax)
			if err != nil {
				r.s.stats.relayErrors.Add(1)
				r.s.log.Warn("outbox scan failed", "db", db, "err", err)
				break
			}
			r.deliver(ctx, credits)
			if len(credits) < relayBatchMax {
				break
			}
			after = storagePos{next.CreatedMS, next.ClaimID}
		}
	}
}

// deliver sends credits to their owners and marks the delivered ones in the
// outbox. It returns how many were delivered.
func (r *relay) deliver(ctx context.Context, credits []model.Credit) int {
	local, remote := []model.Credit{}, map[string][]model.Credit{}
	m := r.s.peers.Map()
	for _, c := range credits {
		if r.s.Owns(c.Shard) {
			local = append(local, c)
			continue
		}
		owner, ok := m.Owner(c.Shard)
		if !ok {
			r.s.stats.relayErrors.Add(1)
			continue // no live owner now: the outbox keeps it
		}
		remote[owner.Addr] = append(remote[owner.Addr], c)
	}
	delivered := 0
	if len(local) > 0 {
		if _, deferred, err := r.sp.store.ApplyCredits(ctx, local); err != nil {
			r.s.stats.relayErrors.Add(1)
			r.s.log.Warn("local credit failed", "credits", len(local), "err", err)
		} else {
			delivered += r.mark(ctx, except(local, deferred))
		}
	}
	for addr, cs := range remote {
		deferred, err := r.post(addr, cs)
		if err != nil {
			r.s.stats.relayErrors.Add(1)
			r.s.log.Warn("relay to cell failed", "addr", addr, "credits", len(cs), "err", err)
			continue
		}
		delivered += r.mark(ctx, except(cs, deferred))
	}
	return delivered
}

// except returns the credits of cs whose claim IDs are not in ids.
func except(cs []model.Credit, ids []string) []model.Credit {
	if len(ids) == 0 {
		return cs
	}
	skip := make(map[string]bool, len(ids))
	for _, id := range ids {
		skip[id] = true
	}
	var out []model.Credit
	for _, c := range cs {
		if !skip[c.ClaimID] {
			out = append(out, c)
		}
	}
	return out
}

func (r *relay) mark(ctx context.Context, cs []model.Credit) int {
	if len(cs) == 0 {
		return 0
	}
	skipped, err := r.sp.store.MarkDelivered(ctx, cs)
	if err != nil {
		// Delivered but not marked: the next scan delivers again, which the
		// receiver ignores.
		r.s.log.Warn("mark delivered failed", "credits", len(cs), "err", err)
		return 0
	}
	r.s.stats.relayed.Add(int64(len(cs) - skipped))
	return len(cs) - skipped
}

// post sends one batch of credits to a cell's /internal/credits and returns
// the claim IDs the receiver deferred.
func (r *relay) post(addr string, cs []model.Credit) ([]string, error) {
	body, err := json.Marshal(api.CreditsRequest{Credits: cs})
	if err != nil {
		return nil, err
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + "/internal/credits")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.SetBody(body)
	deadline := time.Now().Add(relayTimeout)
	req.Header.Set(api.HeaderDeadline, strconv.FormatInt(deadline.UnixMilli(), 10))
	req.Header.Set(api.HeaderPartial, "1") // this relay reads the deferred list
	if r.sp.stress {
		req.Header.Set(api.HeaderStress, "1") // shadow claims go to shadow wallets
	}
	r.s.signer.SignRequest(req, r.s.now()) // last: it covers the target, the stress flag and the body
	if err := r.client.DoDeadline(req, resp, deadline); err != nil {
		return nil, err
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return nil, fmt.Errorf("cell answered %d: %s", resp.StatusCode(), resp.Body())
	}
	var out api.CreditsResponse
	if err := json.Unmarshal(resp.Body(), &out); err != nil {
		return nil, fmt.Errorf("cell answered %q: %w", resp.Body(), err)
	}
	return out.Deferred, nil
}
