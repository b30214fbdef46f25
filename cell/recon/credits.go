package recon

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"redcell/api"
	"redcell/internal/incident"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// checkCredits checks that each claim is credited as claimed: in this
// cell's flow tables for its own claimants, through the owner's
// /internal/recon for the others. The local lookups and each other cell's
// calls run side by side (each in order, chunkMax claims at a time), since
// they wait on different databases; their results are added in a fixed
// order (local, then the cells by name). A claim not credited is looked for
// where its credit was sent (findElsewhere); one not found there either is
// lag: counted, and handed to Config.Redrive.
func (r *Reconciler) checkCredits(ctx context.Context, i int, claims []model.Credit, p *pass) {
	sp := r.spaces[i]
	local, remote, noOwner := r.cfg.Peers.Map().GroupByOwner(claims, r.cfg.Owns)
	p.unverified += int64(noOwner) // no live owner to ask now
	lanes := r.creditLanes(i, local, remote)
	runCreditLanes(ctx, lanes)
	round := model.Diffs{}
	var unchecked []model.Credit
	for _, l := range lanes {
		p.credited = p.credited.Plus(l.out.credited)
		round.Merge(l.out.diffs)
		p.unverified += l.out.unverified
		unchecked = append(unchecked, l.out.unchecked...)
	}
	if noOwner > 0 {
		unchecked = append(unchecked, ungrouped(claims, local, remote)...)
	}
	// Not known credited, though not known missing either: handed to the
	// relay too (a receiver refuses those it credited before), so that a
	// claim reconciliation moves past is never left to no one.
	if r.cfg.Redrive != nil && len(unchecked) > 0 {
		r.cfg.Redrive(sp.Name, unchecked)
	}
	checked := make(map[string]string, len(claims)) // claim ID → the cell asked
	for _, c := range local {
		checked[c.ClaimID] = r.cfg.Cell
	}
	for _, g := range remote {
		for _, c := range g.Credits {
			checked[c.ClaimID] = g.Cell.Name
		}
	}
	r.findElsewhere(ctx, sp, claims, checked, round)
	if missing := round[model.DiffCreditMissing]; len(missing) > 0 {
		// Not credited at the settle age, and not where it was sent: lag.
		delete(round, model.DiffCreditMissing)
		r.lag(sp, claims, missing, p)
	}
	p.diffs.Merge(round)
}

// creditLane is one place checkCredits asks about credits: this cell's
// books, or one other cell.
type creditLane struct {
	credits []model.Credit
	track   *incident.Tracker
	check   func(ctx context.Context, chunk []model.Credit) (model.CreditCheck, error)
	out     creditResult
}

// creditLanes are the lanes of space i's claims: the local ones (looked up
// in its books) first, then one per other cell, in the order of the cells'
// names (asked through its /internal/recon).
func (r *Reconciler) creditLanes(i int, local []model.Credit, remote []sharding.Group) []*creditLane {
	sp := r.spaces[i]
	lanes := make([]*creditLane, 0, 1+len(remote))
	if len(local) > 0 {
		lanes = append(lanes, &creditLane{credits: local, track: r.inc[i].credits,
			check: func(ctx context.Context, chunk []model.Credit) (model.CreditCheck, error) {
				found, err := storage.CreditsOf(ctx, sp.Books, chunk)
				if err != nil {
					return model.CreditCheck{}, err
				}
				return model.CompareCredits(chunk, found), nil
			}})
	}
	for _, g := range remote { // in the order of the cells' names
		addr := g.Cell.Addr
		lanes = append(lanes, &creditLane{credits: g.Credits, track: r.inc[i].ask.Of(addr),
			check: func(ctx context.Context, chunk []model.Credit) (model.CreditCheck, error) {
				return ask(ctx, sp.Client, addr, chunk)
			}})
	}
	return lanes
}

// runCreditLanes runs the lanes side by side (each in order: checkLane) and
// returns when all are done, each lane's result in its out.
func runCreditLanes(ctx context.Context, lanes []*creditLane) {
	var wg sync.WaitGroup
	for _, l := range lanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.out = checkLane(ctx, l.credits, l.track, l.check)
		}()
	}
	wg.Wait()
}

// ungrouped are the claims GroupByOwner put neither in local nor in remote:
// those of shards with no live owner.
func ungrouped(claims, local []model.Credit, remote []sharding.Group) []model.Credit {
	var out []model.Credit
	grouped := make(map[string]bool, len(claims))
	for _, c := range local {
		grouped[c.ClaimID] = true
	}
	for _, g := range remote {
		for _, c := range g.Credits {
			grouped[c.ClaimID] = true
		}
	}
	for _, c := range claims {
		if !grouped[c.ClaimID] {
			out = append(out, c)
		}
	}
	return out
}

// lagSamples is how many lagging claim IDs a pass keeps for its log line.
const lagSamples = 5

// lag counts the claims missing (by ID, of claims) as lagging and hands them
// to Config.Redrive.
func (r *Reconciler) lag(sp Space, claims []model.Credit, missing []string, p *pass) {
	p.lagging += int64(len(missing))
	isMissing := make(map[string]bool, len(missing))
	for _, id := range missing {
		isMissing[id] = true
	}
	out := make([]model.Credit, 0, len(missing))
	for _, c := range claims {
		if isMissing[c.ClaimID] {
			out = append(out, c)
			if len(p.lagSample) < lagSamples {
				p.lagSample = append(p.lagSample, c.ClaimID)
			}
		}
	}
	if r.cfg.Redrive != nil && len(out) > 0 {
		r.cfg.Redrive(sp.Name, out)
	}
}

// findElsewhere looks for the credits of round's credit_missing claims
// whose rows say they were sent to a cell other than the one asked
// (Credit.Dest; checked names the cell asked, by claim ID): in that cell's
// copy of the claimant's database (Client.ReconCopy). Those found move to
// credit_elsewhere: not lost, but in a copy no cell serves (a database
// handed over without them). A cell that cannot be asked leaves its claims
// credit_missing (lag, to be re-driven).
func (r *Reconciler) findElsewhere(ctx context.Context, sp Space, claims []model.Credit, checked map[string]string, round model.Diffs) {
	missing := round[model.DiffCreditMissing]
	if len(missing) == 0 {
		return
	}
	isMissing := make(map[string]bool, len(missing))
	for _, id := range missing {
		isMissing[id] = true
	}
	byDest := map[string][]model.Credit{}
	for _, c := range claims {
		if isMissing[c.ClaimID] && c.Dest != "" && c.Dest != checked[c.ClaimID] {
			byDest[c.Dest] = append(byDest[c.Dest], c)
		}
	}
	if len(byDest) == 0 {
		return
	}
	cells := r.cfg.Peers.Map().Cells()
	found := map[string]bool{}
	for _, dest := range slices.Sorted(maps.Keys(byDest)) {
		i := slices.IndexFunc(cells, func(c sharding.Cell) bool { return c.Name == dest })
		if i < 0 {
			continue
		}
		cs := byDest[dest]
		for start := 0; start < len(cs) && ctx.Err() == nil; start += chunkMax {
			chunk := cs[start:min(start+chunkMax, len(cs))]
			actx, cancel := context.WithTimeout(ctx, askTimeout)
			out, err := sp.Client.ReconCopy(actx, cells[i].Addr, chunk)
			cancel()
			if err != nil {
				r.cfg.Log.Warn("reconciliation could not ask where credits were applied", "space", sp.Name, "cell", dest, "claims", len(chunk), "err", err)
				break
			}
			notThere := make(map[string]bool, len(out.Missing)+len(out.Mismatched))
			for _, id := range append(out.Missing, out.Mismatched...) {
				notThere[id] = true
			}
			for _, c := range chunk {
				if !notThere[c.ClaimID] {
					found[c.ClaimID] = true
				}
			}
		}
	}
	if len(found) == 0 {
		return
	}
	round[model.DiffCreditMissing] = slices.DeleteFunc(missing, func(id string) bool { return found[id] })
	if len(round[model.DiffCreditMissing]) == 0 {
		delete(round, model.DiffCreditMissing)
	}
	for id := range found {
		round[model.DiffCreditElsewhere] = append(round[model.DiffCreditElsewhere], id)
	}
	slices.Sort(round[model.DiffCreditElsewhere])
}

// creditResult is what the credit checks of one lane found.
type creditResult struct {
	credited   model.Tally
	diffs      model.Diffs
	unverified int64
	unchecked  []model.Credit // the claims of the unverified chunks
}

// checkLane checks cs chunkMax claims at a time with check; a chunk that
// cannot be checked counts as unverified and is reported to track (once
// clean, track hears OK).
func checkLane(ctx context.Context, cs []model.Credit, track *incident.Tracker,
	check func(context.Context, []model.Credit) (model.CreditCheck, error)) creditResult {
	out := creditResult{diffs: model.Diffs{}}
	failed := false
	for start := 0; start < len(cs) && ctx.Err() == nil; start += chunkMax {
		chunk := cs[start:min(start+chunkMax, len(cs))]
		cc, err := check(ctx, chunk)
		if err != nil {
			out.unverified += int64(len(chunk))
			if ctx.Err() == nil { // not when the cell stops: its relay is stopping too
				out.unchecked = append(out.unchecked, chunk...)
			}
			if ctx.Err() == nil {
				failed = true
				track.Fail(err, "claims", len(chunk))
			}
			continue
		}
		out.credited = out.credited.Plus(cc.Matched)
		out.diffs.Merge(cc.Diffs)
	}
	if !failed && ctx.Err() == nil {
		track.OK()
	}
	return out
}

// askTimeout bounds one call to another cell: it reads up to chunkMax
// credit flows there.
const askTimeout = 10 * time.Second

// ask asks the cell at addr about cs within askTimeout and checks that its
// answer accounts for every claim.
func ask(ctx context.Context, c Client, addr string, cs []model.Credit) (model.CreditCheck, error) {
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	out, err := c.Recon(ctx, addr, cs)
	if err != nil {
		return model.CreditCheck{}, err
	}
	cc := model.CreditCheck{Matched: model.Tally{Count: out.Matched, Cents: model.Cents(out.MatchedCents)}, Diffs: model.Diffs{}}
	if len(out.Missing) > 0 {
		cc.Diffs[model.DiffCreditMissing] = out.Missing
	}
	if len(out.Mismatched) > 0 {
		cc.Diffs[model.DiffCreditMismatch] = out.Mismatched
	}
	if n := cc.Matched.Count + int64(cc.Diffs.Count()); n != int64(len(cs)) {
		return model.CreditCheck{}, fmt.Errorf("cell accounted for %d of %d claims", n, len(cs))
	}
	return cc, nil
}

// Answer is what a cell answers to POST /internal/recon: which of the claims
// another cell asks about are credited here as claimed, read from books (the
// caller has checked the call's signature and the credits). It reads only.
// Errors: the store's.
func Answer(ctx context.Context, books Books, credits []model.Credit) (api.ReconResponse, error) {
	found, err := storage.CreditsOf(ctx, books, credits)
	if err != nil {
		return api.ReconResponse{}, err
	}
	cc := model.CompareCredits(credits, found)
	return api.ReconResponse{Matched: cc.Matched.Count, MatchedCents: int64(cc.Matched.Cents),
		Missing: orEmpty(cc.Diffs[model.DiffCreditMissing]), Mismatched: orEmpty(cc.Diffs[model.DiffCreditMismatch])}, nil
}

func orEmpty(ids []string) []string {
	if ids == nil {
		return []string{}
	}
	return ids
}
