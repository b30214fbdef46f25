package sim

import (
	"fmt"
	"sort"
	"strings"

	"redcell/model"
	"redcell/storage"
)

// checker holds the simulator's view of every packet, built from what the
// store calls returned, and runs the checks: incremental ones after each
// store call (cheap: one packet, one account, one batch of credits), a full
// audit of every cell's rows every Config.AuditEvery steps, and the final
// checks after the network healed and the relays drained.
type checker struct {
	w             *world
	packets       map[model.PacketID]*packetView // looked up; packetOrder gives the order
	packetOrder   []model.PacketID
	lastAuditStep int
	audits        int
}

// packetView is one packet as the checker knows it.
type packetView struct {
	ref     model.PacketRef
	amount  model.Cents
	claims  []model.Claim          // by seq: claims[i].Seq == i+1
	users   map[string]model.Claim // by act_id
	claimed model.Cents
	refund  model.Cents
	// synced is false after a store call on the packet failed: it may have
	// been applied all the same (a lost COMMIT answer), so the view is read
	// again from the store before it is trusted.
	synced bool
}

func newChecker(w *world) *checker {
	return &checker{w: w, packets: map[model.PacketID]*packetView{}}
}

// view returns the packet's view, read from cell c's store when it is new or
// not in sync.
func (k *checker) view(c *cell, ref model.PacketRef) *packetView {
	v := k.packets[ref.ID]
	if v == nil {
		v = &packetView{ref: ref}
		k.packets[ref.ID] = v
		k.packetOrder = append(k.packetOrder, ref.ID)
	}
	if !v.synced {
		k.resync(c, v)
	}
	return v
}

// resync reads the packet and all its claims from the store.
func (k *checker) resync(c *cell, v *packetView) {
	w := k.w
	p, err := storage.Packet(w.ctx, c.store, v.ref)
	if err != nil {
		w.fail("packet-exists", []string{string(v.ref.ID)}, "packet %s cannot be read: %v", v.ref.ID, err)
		return
	}
	v.amount, v.refund, v.claims, v.users, v.claimed = p.Amount, p.RefundAmount, nil, map[string]model.Claim{}, 0
	for after := int64(0); ; {
		page, err := storage.Claims(w.ctx, c.store, v.ref, after, 1000)
		if err != nil {
			w.fail("packet-exists", []string{string(v.ref.ID)}, "claims of %s cannot be read: %v", v.ref.ID, err)
			return
		}
		for _, cl := range page {
			if !k.addClaim(v, cl) {
				return
			}
			after = cl.Seq
		}
		if len(page) < 1000 {
			break
		}
	}
	v.synced = true
	k.checkPacket(v, p)
}

// addClaim adds a new claim to v: the next seq, a user without a claim, at
// least a cent.
func (k *checker) addClaim(v *packetView, cl model.Claim) bool {
	keys := []string{cl.ID, cl.ActID}
	if prev, dup := v.users[cl.ActID]; dup {
		k.w.fail("one-claim-per-user", append(keys, prev.ID), "%s holds claims %s and %s of packet %s", cl.ActID, prev.ID, cl.ID, v.ref.ID)
		return false
	}
	if cl.Seq != int64(len(v.claims))+1 || cl.ID != model.ClaimID(v.ref.ID, cl.Seq) || cl.Amount < 1 || cl.PacketID != v.ref.ID {
		k.w.fail("claim-row", keys, "claim %+v of packet %s after %d claims", cl, v.ref.ID, len(v.claims))
		return false
	}
	v.claims = append(v.claims, cl)
	v.users[cl.ActID] = cl
	v.claimed += cl.Amount
	return true
}

// checkPacket: the packet row agrees with its claims (conservation of the
// packet) and its status with its remainder.
func (k *checker) checkPacket(v *packetView, p model.Packet) {
	keys := []string{string(p.ID)}
	n := int64(len(v.claims))
	switch {
	case p.Amount != v.amount:
		k.w.fail("packet-conservation", keys, "packet %s amount %d, was %d", p.ID, p.Amount, v.amount)
	case v.claimed+p.RemainingAmount+p.RefundAmount != p.Amount:
		k.w.fail("packet-conservation", keys, "packet %s: claims %d + remaining %d + refund %d != amount %d",
			p.ID, v.claimed, p.RemainingAmount, p.RefundAmount, p.Amount)
	case p.Count-p.RemainingCount != n:
		k.w.fail("packet-conservation", keys, "packet %s: count %d - remaining %d != %d claims", p.ID, p.Count, p.RemainingCount, n)
	case p.Status == model.StatusOpen && (p.RemainingCount < 1 || int64(p.RemainingAmount) < p.RemainingCount):
		k.w.fail("packet-status", keys, "open packet %s holds %d cents for %d shares", p.ID, p.RemainingAmount, p.RemainingCount)
	case p.Status == model.StatusSoldOut && (p.RemainingCount != 0 || p.RemainingAmount != 0 || p.RefundAmount != 0):
		k.w.fail("packet-status", keys, "sold-out packet %s: %+v", p.ID, p)
	case p.Status == model.StatusRefunded && (p.RemainingAmount != 0 || p.RefundAmount != p.Amount-v.claimed):
		k.w.fail("refund-exact", keys, "refunded packet %s: refund %d, amount %d - claims %d", p.ID, p.RefundAmount, p.Amount, v.claimed)
	}
}

// sent checks a send's result.
func (k *checker) sent(c *cell, s model.ShardID, req model.SendRequest, p model.Packet, repeat bool) {
	w := k.w
	keys := []string{string(p.ID), req.OrderNo}
	ref, err := model.ParsePacketID(string(p.ID))
	if err != nil || ref.Shard != s || p.Sender != req.Sender || p.Amount != req.Amount || p.Count != req.Count || p.Kind != req.Kind {
		w.fail("send-result", keys, "send %+v returned packet %+v (%v)", req, p, err)
		return
	}
	if _, known := k.packets[p.ID]; known && !repeat {
		w.fail("send-once", keys, "send %s returned packet %s as new twice", req.OrderNo, p.ID)
		return
	}
	if !repeat && (p.RemainingAmount != p.Amount || p.RemainingCount != p.Count || p.Status != model.StatusOpen) {
		w.fail("send-result", keys, "new packet %+v is not whole", p)
		return
	}
	k.view(c, ref)
	k.accountNotNegative(c, s, req.Sender)
}

func (k *checker) accountNotNegative(c *cell, s model.ShardID, actID string) {
	a, err := storage.Account(k.w.ctx, c.store, s, actID)
	if err != nil {
		k.w.fail("account", []string{actID}, "account %s cannot be read: %v", actID, err)
		return
	}
	k.balance(c, a)
}

func (k *checker) balance(_ *cell, a model.Account) {
	if a.Balance < 0 {
		k.w.fail("balance-not-negative", []string{a.ActID}, "account %s has balance %d", a.ActID, a.Balance)
	}
}

func (k *checker) depositApplied(_ *cell, _ model.ShardID, d model.Deposit) {
	if !d.Repeat && d.Balance < d.Amount {
		k.w.fail("deposit-result", []string{d.OrderNo, d.ActID}, "deposit %s of %d left balance %d", d.OrderNo, d.Amount, d.Balance)
	}
}

// openFailed: a failed batch may have been applied (lost answer).
func (k *checker) openFailed(ref model.PacketRef) {
	if v := k.packets[ref.ID]; v != nil {
		v.synced = false
	}
}

// opened checks one open batch: fresh claims take the next seqs, go to users
// without a claim, and conserve the packet; repeats return the earlier claim;
// sold out and expired are told only when true.
func (k *checker) opened(c *cell, ref model.PacketRef, reqs []model.OpenRequest, results []model.OpenResult, p model.Packet) {
	w := k.w
	keys := []string{string(ref.ID)}
	if len(results) != len(reqs) {
		w.fail("open-result", keys, "%d results for %d opens", len(results), len(reqs))
		return
	}
	if p.ID == "" {
		if _, known := k.packets[ref.ID]; known {
			w.fail("packet-exists", keys, "packet %s was not found by an open", ref.ID)
		}
		return
	}
	trusted := true
	if v := k.packets[ref.ID]; v == nil || !v.synced {
		trusted = false // read back below, with this batch in it
	}
	v := k.view(c, ref)
	if w.violation != nil {
		return
	}
	var fresh, repeats []model.Claim
	for i, r := range results {
		switch {
		case r.Err != nil && errIs(r.Err, model.ErrSoldOut):
			if p.RemainingCount != 0 {
				w.fail("open-result", keys, "open told sold out with %d shares left", p.RemainingCount)
			}
		case r.Err != nil && errIs(r.Err, model.ErrExpired):
			if p.Status != model.StatusRefunded && w.timeNow().UnixMilli() < p.ExpiresMS {
				w.fail("open-result", keys, "open told expired before %d", p.ExpiresMS)
			}
		case r.Err != nil:
			w.fail("open-result", append(keys, reqs[i].ActID), "open by %s failed alone: %v", reqs[i].ActID, r.Err)
		case r.Claim.ActID != reqs[i].ActID:
			w.fail("open-result", append(keys, reqs[i].ActID), "open by %s answered claim %+v", reqs[i].ActID, r.Claim)
		case r.Repeat:
			repeats = append(repeats, r.Claim)
		default:
			fresh = append(fresh, r.Claim)
		}
		if w.violation != nil {
			return
		}
	}
	sort.Slice(fresh, func(i, j int) bool { return fresh[i].Seq < fresh[j].Seq })
	for _, cl := range fresh {
		if !trusted {
			if got, ok := v.users[cl.ActID]; !ok || got != cl {
				w.fail("answered-claim-exists", []string{cl.ID, cl.ActID}, "open answered claim %+v, the store holds %+v", cl, got)
				return
			}
			continue
		}
		if !k.addClaim(v, cl) {
			return
		}
	}
	for _, cl := range repeats {
		if prev, ok := v.users[cl.ActID]; !ok || prev != cl {
			w.fail("one-claim-per-user", []string{cl.ID, cl.ActID}, "repeat open by %s answered %+v, the store holds %+v", cl.ActID, cl, prev)
			return
		}
	}
	k.checkPacket(v, p)
}

// openedClosed checks opens a cell answered from its set of closed packets:
// the packet must be in a final state, and the answers are checked as a
// batch's are.
func (k *checker) openedClosed(c *cell, ref model.PacketRef, reqs []model.OpenRequest, results []model.OpenResult) {
	w := k.w
	p, err := storage.Packet(w.ctx, c.store, ref)
	if err != nil {
		w.fail("packet-exists", []string{string(ref.ID)}, "closed packet %s cannot be read: %v", ref.ID, err)
		return
	}
	if p.Status == model.StatusOpen && p.RemainingCount > 0 && w.timeNow().UnixMilli() < p.ExpiresMS {
		w.fail("closed-stays-closed", []string{string(ref.ID)}, "%s answered opens of packet %s as closed, it is open: %+v", c.name, ref.ID, p)
		return
	}
	k.opened(c, ref, reqs, results, p)
}

func errIs(err error, target *model.Error) bool {
	code, _ := model.CodeOf(err)
	return code == target.Code
}

// claimCreatedMS is when a claim was made, Unix ms (0: unknown).
func (k *checker) claimCreatedMS(claimID string) int64 {
	ref, seq, err := model.ParseClaimID(claimID)
	if err != nil {
		return 0
	}
	if v := k.packets[ref.ID]; v != nil && seq <= int64(len(v.claims)) {
		return v.claims[seq-1].CreatedMS
	}
	return 0
}

// refunded checks a refund: once per packet, the exact remainder, only
// after expiry.
func (k *checker) refunded(c *cell, ref model.PacketRef, cents model.Cents) {
	w := k.w
	keys := []string{string(ref.ID)}
	v := k.packets[ref.ID]
	trusted := v != nil && v.synced
	if trusted && cents > 0 && v.refund > 0 {
		w.fail("refund-once", keys, "packet %s refunded %d after an earlier refund of %d", ref.ID, cents, v.refund)
		return
	}
	v = k.view(c, ref)
	if w.violation != nil {
		return
	}
	p, err := storage.Packet(w.ctx, c.store, ref)
	if err != nil {
		w.fail("packet-exists", keys, "packet %s cannot be read after its refund: %v", ref.ID, err)
		return
	}
	switch {
	case cents > 0 && (p.Status != model.StatusRefunded || p.RefundAmount != cents):
		w.fail("refund-exact", keys, "refund of %d left packet %+v", cents, p)
	case cents > 0 && w.timeNow().UnixMilli() < p.ExpiresMS:
		w.fail("refund-after-expiry", keys, "packet %s refunded before it expired at %d", ref.ID, p.ExpiresMS)
	case cents == 0 && p.Status == model.StatusOpen && w.timeNow().UnixMilli() >= p.ExpiresMS:
		w.fail("refund-at-expiry", keys, "expired open packet %s was refunded nothing", ref.ID)
	}
	v.refund = p.RefundAmount
	k.checkPacket(v, p)
	k.accountNotNegative(c, ref.Shard, p.Sender)
}

func (k *checker) refundFailed(ref model.PacketRef) { k.openFailed(ref) }

// credited checks that credits just applied (not deferred) are booked, once,
// to their claimant with their amount.
func (k *checker) credited(c *cell, credits []model.Credit, deferred []string) {
	w := k.w
	skip := make(map[string]bool, len(deferred))
	for _, id := range deferred {
		skip[id] = true
	}
	var booked []model.Credit
	for _, cr := range credits {
		if !skip[cr.ClaimID] {
			booked = append(booked, cr)
		}
	}
	if len(booked) == 0 {
		return
	}
	got, err := storage.CreditsOf(w.ctx, c.store, booked)
	if err != nil {
		w.fail("credit-booked", nil, "CreditsOf on %s: %v", c.name, err)
		return
	}
	for _, cr := range booked {
		b, ok := got[cr.ClaimID]
		if !ok || b.ActID != cr.ActID || b.Amount != cr.Amount {
			w.fail("credit-booked", []string{cr.ClaimID, cr.ActID}, "credit %+v applied, %s holds %+v", cr, c.name, b)
			return
		}
	}
}

// afterEvent runs the full audit every Config.AuditEvery steps.
func (k *checker) afterEvent() {
	if k.w.client.started-k.lastAuditStep >= k.w.cfg.AuditEvery {
		k.lastAuditStep = k.w.client.started
		k.audit(false)
	}
}

// drained reports whether every claim is credited: every cell is up and its
// relay holds nothing and has nothing left to read, and then (nothing more
// would be delivered) every claim in the cluster's rows is credited. A claim
// left uncredited then is a violation (credited-exactly-once) naming it.
func (k *checker) drained() bool {
	w := k.w
	for _, c := range w.cells {
		if c.down || !c.relay.idle() {
			return false
		}
	}
	claims, credited := map[string]model.Claim{}, map[string]bool{}
	for _, c := range w.cells {
		l, err := c.store.Ledger(w.ctx, c.name)
		if err != nil {
			w.fail("ledger", nil, "Ledger of %s: %v", c.name, err)
			return true
		}
		for id, cl := range l.Claims {
			claims[id] = cl
		}
		for id := range l.Credits {
			credited[id] = true
		}
	}
	var lost []string
	for id := range claims {
		if !credited[id] {
			lost = append(lost, id)
		}
	}
	if len(lost) > 0 {
		sort.Strings(lost)
		cl, made := claims[lost[0]], "at an unknown time"
		if ms := k.claimCreatedMS(lost[0]); ms > 0 {
			made = fmt.Sprintf("at t=%d ms", ms-simStart.UnixMilli())
		}
		w.fail("credited-exactly-once", lost[:min(len(lost), 4)], "%d claims are not credited and no relay holds or will read them: %s (%s, %d cents, made %s)",
			len(lost), lost[0], cl.ActID, cl.Amount, made)
	}
	return true
}

// final runs after the drain: a full audit with nothing in flight, every
// packet closed, every claim credited exactly once.
func (k *checker) final() { k.audit(true) }

// audit reads every cell's rows (Store.Ledger) and checks what `redcell
// audit` checks (model.Audit, model.AuditCell), then what the clients were
// told: every answered claim exists exactly once, deposits are neither lost
// nor invented. With final, nothing may be in flight and every packet must
// be sold out or refunded with its exact remainder.
func (k *checker) audit(final bool) {
	w := k.w
	k.audits++
	w.count("check.audit")
	w.log.begin(w, "audit").kv("final", b2i(final)).end()
	ledgers := make([]model.Ledger, len(w.cells))
	for i, c := range w.cells {
		l, err := c.store.Ledger(w.ctx, c.name)
		if err != nil {
			w.fail("ledger", nil, "Ledger of %s: %v", c.name, err)
			return
		}
		ledgers[i] = l
		if a := model.AuditCell(l, c.owns); !a.OK() {
			w.fail("cell-audit", keysIn(a.Problems), "%s: difference %d, %d problems: %s", c.name, a.Difference, len(a.Problems), first(a.Problems))
			return
		}
	}
	rep := model.Audit(ledgers)
	if !rep.OK() {
		w.fail("audit", keysIn(rep.Problems), "difference %d, %d problems: %s", rep.Difference, len(rep.Problems), first(rep.Problems))
		return
	}
	claims := map[string]model.Claim{}
	for _, l := range ledgers {
		for id, cl := range l.Claims {
			claims[id] = cl
		}
	}
	problems := k.toldProblems(ledgers, claims)
	if final {
		problems = append(problems, k.finalProblems(rep, claims)...)
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		check, _, _ := strings.Cut(problems[0], ":")
		w.fail(check, keysIn(problems[:1]), "%d problems: %s", len(problems), problems[0])
	}
}

// toldProblems compares the rows with what the clients were told: one claim
// per user and packet, every answered claim there as answered, deposits
// neither lost nor invented. Each problem starts with its check's name.
func (k *checker) toldProblems(ledgers []model.Ledger, claims map[string]model.Claim) []string {
	var problems []string
	perUser := make(map[string][]string, len(claims)) // packet/act_id → claim IDs
	for id, cl := range claims {
		key := string(cl.PacketID) + "/" + cl.ActID
		perUser[key] = append(perUser[key], id)
	}
	for key, ids := range perUser {
		if len(ids) > 1 {
			sort.Strings(ids)
			problems = append(problems, fmt.Sprintf("one-claim-per-user: %s holds claims %s", key, strings.Join(ids, ", ")))
		}
	}
	cb := k.w.client
	for _, key := range cb.claimOrder {
		b := cb.claims[key]
		cl, ok := claims[b.claimID]
		if !ok || cl.ActID != b.actID || int64(cl.Amount) != b.amount || len(perUser[key]) != 1 {
			problems = append(problems, fmt.Sprintf("answered-claim-exists: claim %s of %d to %s was answered, the rows hold %+v", b.claimID, b.amount, b.actID, cl))
		}
	}
	var deposits, attempted, answered model.Cents
	for _, l := range ledgers {
		deposits += l.Deposits
	}
	for _, order := range cb.depositOrder {
		b := cb.deposits[order]
		attempted += model.Cents(b.amount)
		if b.answered {
			answered += model.Cents(b.amount)
		}
	}
	if deposits > attempted || deposits < answered {
		problems = append(problems, fmt.Sprintf("deposits: the rows hold %d cents of deposits, the clients asked for %d and were answered for %d", deposits, attempted, answered))
	}
	return problems
}

// finalProblems are the checks of the end, after the drain: nothing in
// flight, every claim credited exactly once, no money left inside packets,
// every packet sold out or refunded with its exact remainder.
func (k *checker) finalProblems(rep model.AuditReport, claims map[string]model.Claim) []string {
	w := k.w
	var problems []string
	if rep.InFlightCount != 0 {
		problems = append(problems, fmt.Sprintf("credited-exactly-once: %d claims (%d cents) were never credited", rep.InFlightCount, rep.InFlight))
	}
	if rep.CreditsCount != rep.ClaimsCount {
		problems = append(problems, fmt.Sprintf("credited-exactly-once: %d claims, %d credits", rep.ClaimsCount, rep.CreditsCount))
	}
	if rep.OpenRemaining != 0 {
		problems = append(problems, fmt.Sprintf("refund-at-expiry: %d cents are still inside packets after every packet expired", rep.OpenRemaining))
	}
	claimedOf := map[model.PacketID]model.Cents{}
	for _, cl := range claims {
		claimedOf[cl.PacketID] += cl.Amount
	}
	for _, id := range k.packetOrder {
		v := k.packets[id]
		p, err := storage.Packet(w.ctx, w.cells[w.cellOf(v.ref.Shard)].store, v.ref)
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("packet-exists: %s: %v", id, err))
		case p.Status == model.StatusOpen:
			problems = append(problems, fmt.Sprintf("refund-at-expiry: packet %s is still open after it expired at %d", id, p.ExpiresMS))
		case p.Status == model.StatusRefunded && p.RefundAmount != p.Amount-claimedOf[id]:
			problems = append(problems, fmt.Sprintf("refund-exact: packet %s refunded %d, amount %d - claims %d", id, p.RefundAmount, p.Amount, claimedOf[id]))
		}
	}
	return problems
}

func first(ps []string) string {
	if len(ps) == 0 {
		return ""
	}
	return ps[0]
}

// keysIn picks the packet and claim IDs out of problem texts (at most 8), the
// keys a trace follows.
func keysIn(problems []string) []string {
	var keys []string
	seen := map[string]bool{}
	for _, p := range problems {
		for _, f := range strings.FieldsFunc(p, func(r rune) bool { return r == ' ' || r == ',' || r == '(' || r == ')' || r == ':' }) {
			if len(f) >= model.PacketIDLen {
				if _, err := model.ParsePacketID(f[:model.PacketIDLen]); err == nil && !seen[f] {
					seen[f] = true
					keys = append(keys, f)
				}
				if pkt := f[:model.PacketIDLen]; !seen[pkt] {
					seen[pkt] = true // the packet's lines: its send, opens, refund
					keys = append(keys, pkt)
				}
			}
		}
		if len(keys) >= 8 {
			break
		}
	}
	return keys
}
