package storage

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"redcell/model"
	"redcell/sharding"
)

var twiceLine = regexp.MustCompile(`^(.* credited twice \(to )(\S+) and (\S+)\)$`)

// sameCellAudit checks that m.CellAudit reports what model.AuditCell reports
// of m's Ledger (the two accounts of a "credited twice" line in either order).
func sameCellAudit(t *testing.T, m *MySQL, owns func(model.ShardID) bool) model.CellAudit {
	t.Helper()
	ctx := context.Background()
	l, err := m.Ledger(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.CellAudit(ctx, "a", owns)
	if err != nil {
		t.Fatal(err)
	}
	norm := func(a model.CellAudit) model.CellAudit {
		a.Problems = slices.Clone(a.Problems)
		for i, p := range a.Problems {
			if m := twiceLine.FindStringSubmatch(p); m != nil && m[2] > m[3] {
				a.Problems[i] = m[1] + m[3] + " and " + m[2] + ")"
			}
		}
		slices.Sort(a.Problems)
		return a
	}
	if g, w := norm(got), norm(model.AuditCell(l, owns)); !reflect.DeepEqual(g, w) {
		t.Fatalf("cell audit in the store:\n%+v\nof the ledger:\n%+v", g, w)
	}
	return got
}

// TestCellAuditFindsWhatTheLedgerFinds: on a cell's rows, clean and then with
// a fault of each kind put straight into its tables, the audit summed and
// joined in the server (CellAudit) reports exactly what model.AuditCell
// reports of the Ledger read into memory: the same sums, counts, kinds of
// difference, claim IDs named and problem lines.
func TestCellAuditFindsWhatTheLedgerFinds(t *testing.T) {
	base := time.Date(2026, 3, 14, 10, 0, 0, 0, time.UTC)
	clk := newSetTime(base)
	m, _, _ := ContractMySQL(t, clk)
	ctx := context.Background()
	sender := "ann"
	deposit(t, m, sender, 10_000)
	ref := send(t, m, sender, 1000, 6, time.Hour)
	other := model.ShardID((int(ref.Shard) + 500) % model.ShardCount)     // a shard the cell does not own
	owns := func(s model.ShardID) bool { return s.Valid() && s != other } // a shard of -1 is owned by no cell
	var credits []model.Credit
	for i := range 6 {
		clk.Set(base.Add(time.Duration(i+1) * time.Millisecond))
		act := fmt.Sprintf("user%d", i)
		res, _, err := OpenBatch(ctx, m, ref, []model.OpenRequest{{ActID: act, Shard: sharding.ShardOfAct(act)}}, rand.New(rand.NewPCG(1, 2)))
		if err != nil || res[0].Err != nil {
			t.Fatal(err, res)
		}
		c := res[0].Claim
		credits = append(credits, model.Credit{ClaimID: c.ID, PacketID: c.PacketID, ActID: c.ActID, Shard: sharding.ShardOfAct(c.ActID), Amount: c.Amount})
	}
	// Five credited, one pending; and a credit of a claim made in another
	// cell (its packet's shard is not owned here).
	elsewhere := model.Credit{ClaimID: string(model.NewPacketID(other, base)) + "c1", ActID: "user0", Shard: credits[0].Shard, Amount: 7}
	if _, _, err := ApplyCredits(ctx, m, append(slices.Clone(credits[:5]), elsewhere)); err != nil {
		t.Fatal(err)
	}
	a := sameCellAudit(t, m, owns)
	if !a.OK() || a.Claims != 6 || a.Claimed != 1000 || a.CreditsPending != 1 || a.CreditsElsewhere != 1 || a.CreditsIn != a.Claimed-credits[5].Amount+7 {
		t.Fatalf("clean cell audit: %+v", a)
	}

	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := m.db.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	claimT := m.claimTable(ref.Shard, ref.Day)
	flowOf := func(c model.Credit) string { return m.flowTable(c.Shard) }
	seq := func(c model.Credit) string { return c.ClaimID[strings.LastIndex(c.ClaimID, "c")+1:] }

	// Rows made before act_shard existed (-1): their claimant's shard is
	// computed from act_id, and the books read the same.
	exec("UPDATE "+claimT+" SET act_shard = -1 WHERE packet_id = ? AND seq IN (?, ?)", string(ref.ID), seq(credits[4]), seq(credits[5]))
	if a := sameCellAudit(t, m, owns); !a.OK() || a.CreditsPending != 1 || a.Claims != 6 {
		t.Fatalf("cell audit with act_shard -1: %+v", a)
	}
	// A claim whose row names a shard the cell does not own is its claimant's
	// cell's to check: not pending here.
	exec("UPDATE "+claimT+" SET act_shard = ? WHERE packet_id = ? AND seq = ?", int(other), string(ref.ID), seq(credits[5]))
	if a := sameCellAudit(t, m, owns); !a.OK() || a.CreditsPending != 0 {
		t.Fatalf("cell audit with the pending claim's claimant elsewhere: %+v", a)
	}

	faults := []struct {
		name string
		do   func()
		kind string // "": no difference, a problem
		n    int    // differences of kind it adds
	}{
		{"a claim's amount changed", func() {
			exec("UPDATE "+claimT+" SET amount = amount + 1 WHERE packet_id = ? AND seq = ?", string(ref.ID), seq(credits[0]))
		}, model.DiffCreditMismatch, 1},
		{"a credit deleted (its balance kept)", func() {
			exec("DELETE FROM "+flowOf(credits[2])+" WHERE act_id = ? AND order_no = ?", credits[2].ActID, "claim:"+credits[2].ClaimID)
		}, "", 0},
		{"a credit's amount changed", func() {
			exec("UPDATE "+flowOf(credits[3])+" SET amount = amount + 1 WHERE act_id = ? AND order_no = ?", credits[3].ActID, "claim:"+credits[3].ClaimID)
		}, model.DiffCreditMismatch, 1},
		{"a credit without a claim", func() {
			for _, id := range []string{string(ref.ID) + "c77", "not-a-claim"} {
				exec("INSERT INTO "+flowOf(credits[0])+" (act_id, order_no, kind, amount, created_ms) VALUES ('mallory', ?, 'credit', 3, 1)", "claim:"+id)
			}
		}, model.DiffCreditOrphan, 2},
		{"a claim credited twice", func() {
			exec("INSERT INTO "+flowOf(credits[4])+" (act_id, order_no, kind, amount, created_ms) VALUES ('eve', ?, 'credit', ?, 1)",
				"claim:"+credits[4].ClaimID, credits[4].Amount)
		}, model.DiffCreditMismatch, 1},
		{"a claim of another cell's claimant credited here to another account", func() {
			exec("INSERT INTO "+flowOf(credits[0])+" (act_id, order_no, kind, amount, created_ms) VALUES ('trent', ?, 'credit', ?, 1)",
				"claim:"+credits[5].ClaimID, credits[5].Amount)
		}, model.DiffCreditMismatch, 1},
		{"an account whose balance is not its flows", func() {
			exec("UPDATE "+m.accountTable(sharding.ShardOfAct(sender))+" SET balance = balance + 1 WHERE act_id = ?", sender)
		}, "", 0},
		{"a packet whose claims do not add up", func() {
			exec("UPDATE "+m.packetTable(ref.Shard, ref.Day)+" SET remaining_amount = remaining_amount + 2 WHERE packet_id = ?", string(ref.ID))
		}, "", 0},
	}
	before := map[string]int{} // the faults add up: each must add its n of its kind
	for _, f := range faults {
		f.do()
		a := sameCellAudit(t, m, owns)
		if a.OK() || f.kind != "" && a.Differences[f.kind] != before[f.kind]+f.n {
			t.Fatalf("after %s: %+v", f.name, a)
		}
		before = a.Differences
	}
}
