package relay

// Delivery: a lane's credits to their cell, and to the cell that holds a
// claimant's database when the map says another one (askElsewhere).

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// deliver applies cs at l's destination within ctx and sorts them:
// delivered (applied now or before, each with the Dest to mark it with),
// deferred (a wallet row was locked); any other credit of cs is no longer
// l's to deliver now (the shard map changed, or a question about where it
// went could not be answered: askElsewhere): the relay holds it and offers
// it again. An error means nothing is known to be applied.
func (r *Relay) deliver(ctx context.Context, l *lane, cs []model.Credit) (delivered, deferred []model.Credit, err error) {
	if l.local {
		// Asked before Enter: a move's freeze of these databases waits for
		// the write, not for questions to other cells.
		cs, done := r.askElsewhere(ctx, l.dest, cs)
		if len(cs) == 0 {
			return done, nil, nil
		}
		if r.cfg.Enter != nil {
			dbs := make([]int, len(cs))
			for i, c := range cs {
				dbs[i] = c.Shard.DB()
			}
			leave := r.cfg.Enter(dbs)
			defer leave()
		}
		// A wallet's database may have moved (or be moving) since the credit
		// was dispatched here: only those still served are applied; the
		// others are offered again, to their new owner.
		mine := cs[:0:0]
		for _, c := range cs {
			if r.cfg.Owns(c.Shard) {
				mine = append(mine, c)
			}
		}
		if len(mine) == 0 {
			return done, nil, nil
		}
		_, ids, err := r.cfg.Store.ApplyCredits(ctx, mine)
		if err != nil {
			return nil, nil, err
		}
		delivered, deferred = SplitDeferred(mine, ids)
		return append(sentTo(delivered, l.dest), done...), deferred, nil
	}
	m := r.cfg.Peers.Map()
	var mine []model.Credit
	addr := ""
	for _, c := range cs {
		if owner, ok := m.Owner(c.Shard); ok && owner.Name == l.dest && !r.cfg.Owns(c.Shard) {
			mine, addr = append(mine, c), owner.Addr
		}
	}
	mine, done := r.askElsewhere(ctx, l.dest, mine)
	if len(mine) == 0 {
		return done, nil, nil
	}
	resp, err := r.cfg.Client.Credits(ctx, addr, mine)
	if err != nil {
		return nil, nil, err
	}
	delivered, deferred = SplitDeferred(mine, resp.Deferred)
	return append(sentTo(delivered, l.dest), done...), deferred, nil
}

// sentTo sets every credit's Dest to dest, the cell that applied it.
func sentTo(cs []model.Credit, dest string) []model.Credit {
	for i := range cs {
		cs[i].Dest = dest
	}
	return cs
}

// askTimeout bounds one question of askElsewhere, so that a hung cell
// delays the credits it is asked about, not the lane's batch.
const askTimeout = 2 * time.Second

// askElsewhere makes a credit applied at most once across the cluster, not
// only per database: before cs are delivered to cell to, it asks about each
// credit that went to another cell before (Credit.Dest, as its claim row
// records it; a row that names no cell gets to recorded first, storage.RecordDest) that cell's copy of the claimant's database (Client.ReconCopy;
// this cell's own copies too, through the same call). A database handed over
// without its rows would otherwise take the credit a second time.
//
//   - Not found there: recorded as sent to to (storage.RecordDest, so that the
//     claim row names where it may be applied) and returned in deliver.
//   - Found there, and to has it too (the database moved with its rows):
//     returned in done with Dest to, acknowledged.
//   - Found there but not at to: returned in done with that Dest,
//     acknowledged; logged at ERROR and counted (Stats.Elsewhere): the
//     money sits in a copy no cell serves; never booked again.
//   - That cell not in the map: nobody to ask (removed, or down; a move
//     needs its source up, so the database came to to by a move that copied
//     its rows): delivered unasked (Stats.Unasked, an incident per cell).
//   - A question that fails (within askTimeout), a record that fails, or a
//     claim held there under another account or amount: in neither; the
//     relay holds the credit (Stats.Held, an incident) and asks about it
//     again.
func (r *Relay) askElsewhere(ctx context.Context, to string, cs []model.Credit) (deliver, done []model.Credit) {
	if !slices.ContainsFunc(cs, func(c model.Credit) bool { return c.Dest != to }) {
		return cs, nil // the common case: each row names to already
	}
	byDest := map[string][]model.Credit{}
	var unnamed []model.Credit // rows that name no cell (no owner when made, an earlier version's): recorded first
	for _, c := range cs {
		switch c.Dest {
		case to:
			deliver = append(deliver, c)
		case "":
			unnamed = append(unnamed, c)
		default:
			byDest[c.Dest] = append(byDest[c.Dest], c)
		}
	}
	if len(unnamed) > 0 {
		if err := r.sendTo(ctx, unnamed, to); err != nil {
			r.Stats.Held.Add(int64(len(unnamed)))
			r.asking.Of("").Fail(err, "credits", len(unnamed), "claim", unnamed[0].ClaimID, "deliver_to", to)
		} else {
			deliver = append(deliver, unnamed...)
		}
	}
	a := asker{r: r, to: to, cells: r.cfg.Peers.Map().Cells()}
	for _, dest := range slices.Sorted(maps.Keys(byDest)) {
		del, dn := a.ask(ctx, dest, byDest[dest])
		deliver, done = append(deliver, del...), append(done, dn...)
	}
	return deliver, done
}

// asker is one askElsewhere's questions about credits to be delivered to
// cell to, with the cells of the map as it read it.
type asker struct {
	r     *Relay
	to    string
	cells []sharding.Cell
}

// addrOf is the address of cell name in the map; false: not in it.
func (a asker) addrOf(name string) (string, bool) {
	i := slices.IndexFunc(a.cells, func(c sharding.Cell) bool { return c.Name == name })
	if i < 0 {
		return "", false
	}
	return a.cells[i].Addr, true
}

// held counts credits the relay keeps, to ask about again, and reports the
// failure to dest's incident.
func (a asker) held(dest string, cs []model.Credit, err error) {
	a.r.Stats.Held.Add(int64(len(cs)))
	a.r.asking.Of(dest).Fail(err, "credits", len(cs), "claim", cs[0].ClaimID, "deliver_to", a.to)
}

// ask sorts the credits asked that went to cell dest before (askElsewhere):
// those to deliver to a.to (recorded as sent there) and those done
// (found applied); the others are held.
func (a asker) ask(ctx context.Context, dest string, asked []model.Credit) (deliver, done []model.Credit) {
	r, to := a.r, a.to
	addr, ok := a.addrOf(dest)
	if !ok {
		r.Stats.Unasked.Add(int64(len(asked)))
		r.unasked.Of(dest).Fail(errDestGone, "credits", len(asked), "claim", asked[0].ClaimID, "deliver_to", to)
		if err := r.sendTo(ctx, asked, to); err != nil {
			a.held(dest, asked, err)
			return nil, nil
		}
		return asked, nil
	}
	r.unasked.Of(dest).OK()
	missing, found, err := r.askCopy(ctx, addr, asked)
	if err != nil {
		a.held(dest, asked, err)
		return nil, nil
	}
	if len(missing) > 0 {
		if err := r.sendTo(ctx, missing, to); err != nil {
			a.held(dest, missing, err)
			return nil, nil // found ones are asked about again with them
		}
		deliver = append(deliver, missing...)
	}
	if len(found) == 0 {
		r.asking.Of(dest).OK()
		return deliver, nil
	}
	return deliver, a.askServing(ctx, dest, found)
}

// askServing asks a.to, which serves the claimants' database now, about
// the credits found applied at dest, where they went before: done are all
// of them but those held (a question that failed). Found at dest and not
// at a.to is logged at ERROR and counted (Stats.Elsewhere).
func (a asker) askServing(ctx context.Context, dest string, found []model.Credit) (done []model.Credit) {
	r, to := a.r, a.to
	// Found where it went. Does to, which serves the database now, have
	// it too (its rows moved with it)?
	toAddr, ok := a.addrOf(to)
	if !ok {
		a.held(dest, found, errDestGone)
		return nil
	}
	notHere, here, err := r.askCopy(ctx, toAddr, found)
	if err != nil {
		a.held(to, found, err)
		return nil
	}
	r.asking.Of(dest).OK()
	done = append(done, sentTo(here, to)...)
	if len(notHere) > 0 {
		r.Stats.Elsewhere.Add(int64(len(notHere)))
		r.log.Error("relay credits found applied at a cell that no longer serves the claimants' database, and not where it is served now: not delivered again",
			"credits", len(notHere), "claim", notHere[0].ClaimID, "act_id", notHere[0].ActID, "amount", notHere[0].Amount,
			"db", notHere[0].Shard.DB(), "applied_at", dest, "served_by", to)
		done = append(done, notHere...)
	}
	return done
}

// askCopy asks the cell at addr, within askTimeout, which of cs its copy of
// the claimants' databases holds credited as claimed: missing are not
// there, found are; a claim held there under another account or amount is
// an error (errConflict), as is an answer that does not account for every
// claim.
func (r *Relay) askCopy(ctx context.Context, addr string, cs []model.Credit) (missing, found []model.Credit, err error) {
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	resp, err := r.cfg.Client.ReconCopy(ctx, addr, cs)
	if err != nil {
		return nil, nil, err
	}
	if len(resp.Mismatched) > 0 {
		return nil, nil, fmt.Errorf("%w: %s", errConflict, resp.Mismatched[0])
	}
	isMissing := setOf(resp.Missing)
	for _, c := range cs {
		if isMissing[c.ClaimID] {
			missing = append(missing, c)
		} else {
			found = append(found, c)
		}
	}
	if int64(len(found)) != resp.Matched {
		return nil, nil, fmt.Errorf("the cell accounted for %d of %d claims", resp.Matched+int64(len(resp.Missing)), len(cs))
	}
	return missing, found, nil
}

// sendTo records, within relayDBTimeout, that cs are about to be delivered
// to cell to (storage.RecordDest).
func (r *Relay) sendTo(ctx context.Context, cs []model.Credit, to string) error {
	ctx, cancel := context.WithTimeout(ctx, relayDBTimeout)
	defer cancel()
	return storage.SendTo(ctx, r.cfg.Store, cs, to)
}

func setOf(ids []string) map[string]bool {
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out
}

// SplitDeferred splits cs into the credits whose claim IDs are not in ids and
// those that are (the IDs a receiver's ApplyCredits deferred), each in cs's
// order. IDs that name no credit of cs are ignored; with no ids, rest is cs.
func SplitDeferred(cs []model.Credit, ids []string) (rest, deferred []model.Credit) {
	if len(ids) == 0 {
		return cs, nil
	}
	in := make(map[string]bool, len(ids))
	for _, id := range ids {
		in[id] = true
	}
	for _, c := range cs {
		if in[c.ClaimID] {
			deferred = append(deferred, c)
		} else {
			rest = append(rest, c)
		}
	}
	return rest, deferred
}

// observeLag reports the credit lag of the credits a delivery by a lane of
// kind local acknowledged at now (Config.CreditLag).
func (r *Relay) observeLag(local bool, cs []model.Credit, now time.Time) {
	f := r.cfg.CreditLag
	if f == nil {
		return
	}
	for _, c := range cs {
		if c.CreatedMS > 0 {
			f(local, max(now.Sub(time.UnixMilli(c.CreatedMS)), 0))
		}
	}
}

// failed records a failed delivery of n credits by l.
func (r *Relay) failed(l *lane, n int, err error) {
	r.Stats.Errors.Add(1)
	r.failures.Of(l.dest).Fail(err, "credits", n, "local", l.local)
}

// succeeded records a delivery that l made.
func (r *Relay) succeeded(l *lane) { r.failures.Of(l.dest).OK() }

// deferredCredits records that one delivery of l had n credits deferred;
// longest is the one deferred most often (nil: none), long how many credits l
// holds that were deferred deferralsLong times or more. Such a credit's wallet
// row has been locked for long: an incident of the lane, logged while one is
// held (incident.Tracker: when it starts, every 10 s, when it ends).
func (r *Relay) deferredCredits(l *lane, n int, longest *queued, long int) {
	r.Stats.Deferred.Add(int64(n))
	t := r.deferrals.Of(l.dest)
	switch {
	case longest != nil && longest.deferrals >= deferralsLong:
		t.Fail(errWalletLocked, "claim", longest.c.ClaimID, "act_id", longest.c.ActID, "deferrals", longest.deferrals, "credits_deferred_long", long)
	case long == 0:
		t.OK()
	}
}

var errWalletLocked = errors.New("a wallet row the credit needs is locked by another transaction")
