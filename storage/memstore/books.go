package memstore

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"redcell/model"
)

// Ledger implements storage.Books: every money row, read under the lock (one
// snapshot), with the row-level checks of storage.MySQL.Ledger: each balance
// equals the sum of its flows; each packet's claims + refund + remainder equal
// its amount, its claims + remaining count equal its count, and its status
// agrees with what is left; no claim is credited twice. As there, Claims
// carry no CreatedMS (but their ActShard and Dest) and Credits only ClaimID,
// ActID and Amount.
func (s *Store) Ledger(ctx context.Context, cell string) (model.Ledger, error) {
	if err := ctx.Err(); err != nil {
		return model.Ledger{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l := model.NewLedger(cell)
	var problems []string
	sums := make(map[acctKey]model.Cents, len(s.accounts))
	credits := map[string][]model.Credit{}
	for k, f := range s.flows {
		sums[acctKey{k.shard, k.act}] += f.Amount
		switch f.Kind {
		case model.FlowDeposit:
			l.Deposits += f.Amount
		case model.FlowSend:
			l.Sends -= f.Amount
		case model.FlowRefund:
			l.RefundFlows += f.Amount
		case model.FlowReward:
			l.Rewards += f.Amount
		case model.FlowWithdraw:
			l.Withdrawals -= f.Amount
		case model.FlowCredit:
			id := creditOrder(k.order)
			credits[id] = append(credits[id], model.Credit{ClaimID: id, ActID: k.act, Shard: k.shard, Amount: f.Amount})
		default:
			problems = append(problems, fmt.Sprintf("unknown flow kind %q", f.Kind))
		}
	}
	for id, cs := range credits {
		// Sorted, so the problem text and the account kept never depend on map order.
		slices.SortFunc(cs, func(a, b model.Credit) int { return strings.Compare(a.ActID, b.ActID) })
		c := cs[0]
		for _, more := range cs[1:] {
			problems = append(problems, fmt.Sprintf("claim %s credited twice (to %s and %s)", id, c.ActID, more.ActID))
			c.ActID, c.Shard, c.Amount = more.ActID, more.Shard, c.Amount+more.Amount
		}
		l.Credits[id] = c
	}
	for k, bal := range s.accounts {
		l.Balances += bal
		if bal != sums[k] || bal < 0 {
			problems = append(problems, fmt.Sprintf("account %s (shard %d): balance %d, flows sum to %d", k.act, k.shard, bal, sums[k]))
		}
	}
	problems = s.ledgerPacketsLocked(&l, problems)
	for _, r := range s.rewards {
		l.RewardRows.AddReward(*r)
	}
	for _, b := range s.budgets.rows {
		l.RewardRows.Budgets = append(l.RewardRows.Budgets, *b)
	}
	sort.Slice(l.RewardRows.Budgets, func(i, j int) bool { return l.RewardRows.Budgets[i].Key < l.RewardRows.Budgets[j].Key })
	for _, lr := range s.budgets.leases {
		l.RewardRows.Leases = append(l.RewardRows.Leases, lr.l)
	}
	sort.Slice(l.RewardRows.Leases, func(i, j int) bool { return l.RewardRows.Leases[i].ID < l.RewardRows.Leases[j].ID })
	l.CouponRows = s.couponRowsLocked()
	sort.Strings(problems)
	l.Problems = problems
	return l, nil
}

// ledgerPacketsLocked adds the packets and their claims to l, with
// storage.MySQL.Ledger's row-level checks of each packet; it returns
// problems with the packets' appended. s.mu must be held.
func (s *Store) ledgerPacketsLocked(l *model.Ledger, problems []string) []string {
	for _, pk := range s.packets {
		p := pk.p
		l.Packets++
		l.PacketTotals += p.Amount
		l.OpenRemaining += p.RemainingAmount
		l.RefundAmounts += p.RefundAmount
		var paid model.Cents
		for i, c := range pk.claims {
			paid += c.Amount
			r := pk.routes[i]
			l.Claims[c.ID] = model.Claim{ID: c.ID, PacketID: c.PacketID, Seq: c.Seq, ActID: c.ActID, Amount: c.Amount, ActShard: r.shard, Dest: r.dest}
		}
		n := int64(len(pk.claims))
		if paid+p.RefundAmount+p.RemainingAmount != p.Amount || n+p.RemainingCount != p.Count ||
			p.Status == model.StatusOpen && (p.RemainingAmount < model.Cents(p.RemainingCount) || p.RemainingCount == 0) ||
			p.Status == model.StatusSoldOut && (p.RemainingCount != 0 || p.RemainingAmount != 0) ||
			p.Status == model.StatusRefunded && p.RemainingAmount != 0 {
			problems = append(problems, fmt.Sprintf("packet %s: amount %d count %d, claims %d in %d, refund %d, remaining %d in %d, status %d",
				p.ID, p.Amount, p.Count, paid, n, p.RefundAmount, p.RemainingAmount, p.RemainingCount, p.Status))
		}
	}
	return problems
}

// reconWindow answers storage.ReconWindowQuery with the cut of MySQL's:
// a window of more than limit claims ends at the creation time of the claim
// past limit (never below fromMS+1), and is read whole. Each claim carries
// its ActShard and Dest.
func (s *Store) reconWindow(ctx context.Context, db int, shards []model.ShardID, days []int, fromMS, toMS int64, limit int) (model.ReconWindow, error) {
	w := model.ReconWindow{FromMS: fromMS, ToMS: toMS, Claims: map[string]model.Claim{}}
	if err := ctx.Err(); err != nil {
		return w, err
	}
	for _, sh := range shards {
		if sh.DB() != db {
			return w, fmt.Errorf("memstore: recon window: shard %d is not in db %d", sh, db)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var in []model.Claim
	for _, k := range s.tableKeysLocked(shards, days) {
		for _, pk := range s.tables[k].packets {
			for i, c := range pk.claims {
				if c.CreatedMS >= fromMS && c.CreatedMS < toMS {
					in = append(in, pk.fullClaim(i))
				}
			}
		}
	}
	if len(in) > limit {
		times := make([]int64, len(in))
		for i, c := range in {
			times[i] = c.CreatedMS
		}
		slices.Sort(times)
		w.ToMS = max(times[max(limit, 0)], fromMS+1)
	}
	for _, c := range in {
		if c.CreatedMS < w.ToMS {
			w.Claims[c.ID] = c
		}
	}
	return w, nil
}

// creditsOf answers storage.CreditsOfQuery: as with MySQL, a credit
// flow is found when its shard is a claimant's shard asked about, its account
// one of the accounts asked about in that shard, and its claim one of the
// claims asked about in that shard.
func (s *Store) creditsOf(ctx context.Context, credits []model.Credit) (map[string]model.Credit, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(credits) > 10_000 {
		return nil, fmt.Errorf("memstore: credits of %d claims: at most 10000 per call", len(credits))
	}
	acts := map[acctKey]bool{}
	var claims []claimKey
	seen := map[claimKey]bool{}
	for _, c := range credits {
		if !c.Shard.Valid() {
			return nil, fmt.Errorf("memstore: credits of claim %s: shard %d out of range", c.ClaimID, c.Shard)
		}
		acts[acctKey{c.Shard, c.ActID}] = true
		if k := (claimKey{c.Shard, c.ClaimID}); !seen[k] {
			seen[k] = true
			claims = append(claims, k)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	found := map[string]model.Credit{}
	for _, k := range claims {
		for _, act := range s.credited[k] {
			if !acts[acctKey{k.shard, act}] {
				continue
			}
			f := s.flows[flowKey{k.shard, act, model.CreditOrderNo(k.claim)}]
			c := model.Credit{ClaimID: k.claim, ActID: act, Amount: f.Amount}
			if prev, twice := found[k.claim]; twice {
				c.Amount += prev.Amount // as MySQL: the sum can never equal the claim
			}
			found[k.claim] = c
		}
	}
	return found, nil
}

// reconPositions answers storage.ReconPositionsQuery.
func (s *Store) reconPositions(ctx context.Context) (map[int]int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.recon), nil
}

// saveReconPositions runs storage.AdvanceReconPositions: a position never moves back.
func (s *Store) saveReconPositions(ctx context.Context, pos map[int]int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for db := range pos {
		if db < 0 || db >= model.ShardCount/10 {
			return fmt.Errorf("memstore: save recon position: database %d out of range", db)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for db, ms := range pos {
		if prev, ok := s.recon[db]; !ok || ms > prev {
			s.recon[db] = ms
		}
	}
	return nil
}

// CellAudit implements storage.Books. The store is in memory already, so it
// audits its Ledger with model.AuditCell.
func (s *Store) CellAudit(ctx context.Context, cell string, owns func(model.ShardID) bool) (model.CellAudit, error) {
	l, err := s.Ledger(ctx, cell)
	if err != nil {
		return model.CellAudit{}, err
	}
	return model.AuditCell(l, owns), nil
}
