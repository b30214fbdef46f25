package testaudit_test

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"redcell/internal/testaudit"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

func TestMain(m *testing.M) { os.Exit(testaudit.Main(m, "redcell/internal/testaudit")) }

// privateNamespace answers a private prefix (testaudit.PrivatePrefix) and,
// on each test server, a store of it, and the servers.
func privateNamespace(t *testing.T) (string, []*storage.MySQL, []string) {
	t.Helper()
	dsns := []string{testenv.MySQLDSN(t, 1), testenv.MySQLDSN(t, 2)}
	prefix := testaudit.PrivatePrefix(t, dsns...)
	var sts []*storage.MySQL
	for _, dsn := range dsns {
		st, err := storage.OpenPrefixed(dsn, 4, prefix)
		if err != nil {
			t.Fatal(err)
		}
		sts = append(sts, st)
		t.Cleanup(func() { st.Close() })
	}
	return prefix, sts, dsns
}

// actIn finds an act_id of pre whose shard is in [from, to].
func actIn(pre string, from, to int) string {
	for i := 0; ; i++ {
		a := fmt.Sprintf("%s-%d", pre, i)
		if s := int(sharding.ShardOfAct(a)); s >= from && s <= to {
			return a
		}
	}
}

// TestAuditCatchesAPlantedDoubleCredit plants, in a private namespace on
// the two test servers laid out as cell-a (0-499, server 1) and cell-b
// (500-999, server 2), what an earlier layout's leftover did to TestEndToEnd:
// a claim on server 1 credited on server 2, past the relay position of its
// database (a legitimate leftover: the audit passes, and Settle moves the
// position past it, not past a later claim credited nowhere), then credited
// again on server 1 (a cell that owned every shard there). The closing audit
// must fail, naming the claim, in the namespace's real space only.
func TestAuditCatchesAPlantedDoubleCredit(t *testing.T) {
	prefix, st, dsns := privateNamespace(t)
	ctx := context.Background()
	pre := testenv.Prefix()
	sender, claimant := actIn(pre+"s", 0, 499), actIn(pre+"c", 500, 999)
	shS, shC := sharding.ShardOfAct(sender), sharding.ShardOfAct(claimant)
	if _, err := storage.Deposit(ctx, st[0], shS, sender, pre+"-dep", 1_000); err != nil {
		t.Fatal(err)
	}
	id := model.NewPacketID(shS, time.Now())
	if _, _, err := storage.Send(ctx, st[0], shS, model.SendRequest{Sender: sender, Amount: 300, Count: 1, Kind: model.KindFixed, OrderNo: pre + "-send"},
		id, time.Now().Add(time.Hour).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	ref, err := model.ParsePacketID(string(id))
	if err != nil {
		t.Fatal(err)
	}
	res, _, err := storage.OpenBatch(ctx, st[0], ref, []model.OpenRequest{{ActID: claimant, Shard: shC}}, mrand.New(mrand.NewPCG(1, 2)))
	if err != nil || len(res) != 1 || res[0].Err != nil {
		t.Fatalf("open: %v %+v", err, res)
	}
	claim := res[0].Claim
	credit := model.Credit{ClaimID: claim.ID, PacketID: id, ActID: claimant, Shard: shC, Amount: claim.Amount}

	audit := func(stage string) model.AuditReport {
		t.Helper()
		s, err := testaudit.Audit(ctx, dsns, prefix, false)
		if err != nil {
			t.Fatalf("%s: %v", stage, err)
		}
		return s.Report
	}
	if r := audit("claim in flight"); !r.OK() || r.InFlightCount != 1 || r.InFlight != 300 || r.Deposits != 1_000 {
		t.Fatalf("claim in flight: %+v, want clean with 300 cents in flight", r)
	}
	if applied, _, err := storage.ApplyCredits(ctx, st[1], []model.Credit{credit}); err != nil || applied != 1 {
		t.Fatalf("credit on server 2: %d %v", applied, err)
	}
	if r := audit("credited once"); !r.OK() || r.InFlightCount != 0 || r.Balances != 1_000 {
		t.Fatalf("credited once: %+v, want clean", r)
	}

	// A second claim, after the credited one and credited nowhere, and a
	// reconciliation position: Settle moves the relay position of the
	// packet's database past the credited claim and not past the other, and
	// forgets the reconciliation position.
	for time.Now().UnixMilli() <= claim.CreatedMS { // the second claim is created a millisecond later at least
	}
	id2 := model.NewPacketID(shS, time.Now())
	if _, _, err := storage.Send(ctx, st[0], shS, model.SendRequest{Sender: sender, Amount: 200, Count: 1, Kind: model.KindFixed, OrderNo: pre + "-send2"},
		id2, time.Now().Add(time.Hour).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	ref2, _ := model.ParsePacketID(string(id2))
	res2, _, err := storage.OpenBatch(ctx, st[0], ref2, []model.OpenRequest{{ActID: claimant, Shard: shC}}, mrand.New(mrand.NewPCG(3, 4)))
	if err != nil || len(res2) != 1 || res2[0].Err != nil {
		t.Fatalf("second open: %v %+v", err, res2)
	}
	claim2 := res2[0].Claim
	if claim2.CreatedMS <= claim.CreatedMS || ref2.Shard.DB() != ref.Shard.DB() {
		t.Fatalf("second claim made at %d in db_%02d, want after %d in db_%02d", claim2.CreatedMS, ref2.Shard.DB(), claim.CreatedMS, ref.Shard.DB())
	}
	db := ref.Shard.DB()
	if err := storage.SaveReconPositions(ctx, st[0], map[int]int64{db: time.Now().UnixMilli()}); err != nil {
		t.Fatal(err)
	}
	if n, err := testaudit.Settle(ctx, dsns); err != nil || n < 1 {
		t.Fatalf("settle: %d %v, want the relay position of db_%02d moved", n, err, db)
	}
	pos, err := storage.RelayPositions(ctx, st[0], []int{db})
	if err != nil || pos[db] != claim.CreatedMS+1 {
		t.Fatalf("relay position of db_%02d after the settle: %v %v, want %d (just past the credited claim, at %d the claim credited nowhere)",
			db, pos, err, claim.CreatedMS+1, claim2.CreatedMS)
	}
	cs, _, err := storage.ClaimsAfter(ctx, st[0], db, pos[db], model.ClaimPos{}, time.Now().UnixMilli(), 10)
	if err != nil || len(cs) != 1 || cs[0].ClaimID != claim2.ID {
		t.Fatalf("claims a relay reads past the position: %+v %v, want only %s", cs, err, claim2.ID)
	}
	if recon, err := storage.ReconPositions(ctx, st[0]); err != nil || len(recon) != 0 {
		t.Fatalf("reconciliation positions after the settle: %v %v, want none", recon, err)
	}
	if _, err := testaudit.Settle(ctx, dsns); err != nil {
		t.Fatal(err)
	}
	if again, err := storage.RelayPositions(ctx, st[0], []int{db}); err != nil || again[db] != pos[db] {
		t.Fatalf("relay position of db_%02d after a second settle: %v %v, want %d still", db, again, err, pos[db])
	}
	if r := audit("settled"); !r.OK() || r.InFlightCount != 1 || r.InFlight != claim2.Amount {
		t.Fatalf("settled: %+v, want clean with the second claim in flight", r)
	}

	// The double credit: the same claim booked on server 1 too.
	if applied, _, err := storage.ApplyCredits(ctx, st[0], []model.Credit{credit}); err != nil || applied != 1 {
		t.Fatalf("second credit on server 1: %d %v", applied, err)
	}
	r := audit("credited twice")
	if r.OK() || r.Difference != -claim.Amount || !strings.Contains(strings.Join(r.Problems, "\n"), claim.ID) {
		t.Fatalf("credited twice: %+v, want a difference of -%d and a problem naming %s", r, claim.Amount, claim.ID)
	}
	if s, err := testaudit.Audit(ctx, dsns, prefix, true); err != nil || !s.Report.OK() {
		t.Fatalf("shadow space of the namespace: %+v %v, want clean (nothing there)", s.Report, err)
	}
	spaces, err := testaudit.Servers(ctx, dsns)
	if err == nil || !strings.Contains(err.Error(), prefix+"db_XX") || !strings.Contains(err.Error(), claim.ID) {
		t.Fatalf("closing audit over every namespace: %v, want a failure of %sdb_XX naming %s", err, prefix, claim.ID)
	}
	found := false
	for _, s := range spaces {
		found = found || s.Prefix == prefix && !s.Shadow && !s.Report.OK()
	}
	if !found {
		t.Fatalf("closing audit: %s", testaudit.Summary(spaces))
	}
}
