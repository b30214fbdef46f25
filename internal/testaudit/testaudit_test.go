package testaudit_test

import (
	"context"
	"database/sql"
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
// a claim on server 1 credited on server 2, its outbox row still pending (a
// legitimate leftover: the audit passes and Settle marks it delivered), then
// credited again on server 1 (a cell that owned every shard there). The
// closing audit must fail, naming the claim, in the namespace's real space
// only.
func TestAuditCatchesAPlantedDoubleCredit(t *testing.T) {
	prefix, st, dsns := privateNamespace(t)
	ctx := context.Background()
	pre := testenv.Prefix()
	sender, claimant := actIn(pre+"s", 0, 499), actIn(pre+"c", 500, 999)
	shS, shC := sharding.ShardOfAct(sender), sharding.ShardOfAct(claimant)
	if _, err := st[0].Deposit(ctx, shS, sender, pre+"-dep", 1_000); err != nil {
		t.Fatal(err)
	}
	id := model.NewPacketID(shS, time.Now())
	if _, _, err := st[0].Send(ctx, shS, model.SendRequest{Sender: sender, Amount: 300, Count: 1, Kind: model.KindFixed, OrderNo: pre + "-send"},
		id, time.Now().Add(time.Hour).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	ref, err := model.ParsePacketID(string(id))
	if err != nil {
		t.Fatal(err)
	}
	res, _, err := st[0].OpenBatch(ctx, ref, []model.OpenRequest{{ActID: claimant, Shard: shC}}, mrand.New(mrand.NewPCG(1, 2)))
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
	if applied, _, err := st[1].ApplyCredits(ctx, []model.Credit{credit}); err != nil || applied != 1 {
		t.Fatalf("credit on server 2: %d %v", applied, err)
	}
	if r := audit("credited once, outbox row pending"); !r.OK() || r.InFlightCount != 0 || r.Balances != 1_000 {
		t.Fatalf("credited once, outbox row pending: %+v, want clean", r)
	}
	if n, err := testaudit.Settle(ctx, dsns); err != nil || n < 1 {
		t.Fatalf("settle: %d %v, want the credited row marked", n, err)
	}
	var state int
	db, _ := sql.Open("mysql", dsns[0])
	defer db.Close()
	if err := db.QueryRow(fmt.Sprintf("SELECT state FROM %sdb_%02d.t_outbox WHERE claim_id = ?", prefix, ref.Shard.DB()), claim.ID).Scan(&state); err != nil || state != 1 {
		t.Fatalf("outbox row after the settle: state %d %v, want 1 (delivered)", state, err)
	}
	if r := audit("settled"); !r.OK() {
		t.Fatalf("settled: %+v", r)
	}

	// The double credit: the same claim booked on server 1 too.
	if applied, _, err := st[0].ApplyCredits(ctx, []model.Credit{credit}); err != nil || applied != 1 {
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
