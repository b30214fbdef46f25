package storage_test

import (
	"context"
	"os"
	"reflect"
	"strconv"
	"testing"
	"time"

	"redcell/internal/clock"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/storage"
	"redcell/storage/memstore"
	"redcell/storage/storagetest"
)

// TestContractMySQL runs the store contract against storage.MySQL on the test
// MariaDB (make test, or deploy/local/testenv.sh); without one it skips (in
// CI it fails). The in-memory store runs the same suite in
// storage/memstore (TestContractMemory).
func TestContractMySQL(t *testing.T) {
	testenv.MySQLDSN(t, 1)
	storagetest.Run(t, mysqlHarness)
}

func mysqlHarness(t *testing.T) storagetest.Harness {
	clk := clock.NewManual(storagetest.Start)
	m, fail, cuts := storage.ContractMySQL(t, rowClock{clk})
	return storagetest.Harness{Store: m, Clock: clk, FailNextCommit: fail, CommitFaults: cuts,
		PutFlow:    func(s model.ShardID, f model.Flow, delta model.Cents) { storage.PutFlowRow(t, m, s, f, delta) },
		HoldWallet: func(s model.ShardID, act string) (func() int, func()) { return storage.HoldWallet(t, m, s, act) }}
}

// TestContractMySQLMatchesMemory runs one seeded workload, with groups
// committed through CommitGroup among the single calls (no faults: on a
// lost COMMIT answer the two stores may answer differently, both within the
// contract) against MariaDB and the in-memory store: every answer is the
// same, code for code and cent for cent, and so are the ledgers' books.
func TestContractMySQLMatchesMemory(t *testing.T) {
	testenv.MySQLDSN(t, 1)
	const steps = 1500
	clk := clock.NewManual(storagetest.Start)
	mem := memstore.New(clk)
	hm := storagetest.Harness{Store: mem, Clock: clk, FailNextCommit: mem.FailNextCommit, CommitFaults: mem.CommitFaults}
	hd := mysqlHarness(t)
	wm := storagetest.NewWorkload(hm, 5, false, true)
	wd := storagetest.NewWorkload(hd, 5, false, true)
	wm.Groups, wd.Groups = true, true
	for i := range steps {
		wm.Step()
		wd.Step()
		if wm.Transcript() != wd.Transcript() {
			t.Fatalf("step %d: the stores answered differently", i)
		}
	}
	ctx := context.Background()
	lm, err := mem.Ledger(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	ld, err := hd.Store.Ledger(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	rm, rd := model.Audit([]model.Ledger{lm}), model.Audit([]model.Ledger{ld})
	if !rm.OK() || !rd.OK() || !reflect.DeepEqual(rm, rd) || !reflect.DeepEqual(lm.Claims, ld.Claims) ||
		!reflect.DeepEqual(lm.Credits, ld.Credits) {
		t.Fatalf("books differ: memory %+v, MariaDB %+v", rm, rd)
	}
	if rm.ClaimsCount == 0 || rm.CreditsCount == 0 || lm.RefundFlows == 0 {
		t.Fatalf("the workload did too little to compare: %+v, refunds %d", rm, lm.RefundFlows)
	}
	t.Logf("%d steps: %d packets, %d claims, %d credits, %d cents refunded: the same in both stores", steps, rm.Packets, rm.ClaimsCount, rm.CreditsCount, lm.RefundFlows)
}

// TestGroupMoneyMySQL is issue 9's money test against storage.MySQL:
// mixed ops through CommitGroup in random groups, each with one injected
// failure (duplicate order number, insufficient balance, sold out, the
// connection cut before COMMIT by the harness's proxy), every answer checked
// against the in-memory store fed the same ops one by one, and the two
// stores' rows compared. REDCELL_GROUP_OPS sets the number of ops (10,000 by
// default); REDCELL_GROUP_SEED replays a seed.
func TestGroupMoneyMySQL(t *testing.T) {
	testenv.MySQLDSN(t, 1)
	ops := 10_000
	if v := os.Getenv("REDCELL_GROUP_OPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("REDCELL_GROUP_OPS=%q: want a positive number of ops", v)
		}
		ops = n
	}
	clk := clock.NewManual(storagetest.Start)
	mem := memstore.New(clk)
	oracle := storagetest.Harness{Store: mem, Clock: clk, FailNextCommit: mem.FailNextCommit, CommitFaults: mem.CommitFaults}
	storagetest.GroupMoney(t, mysqlHarness(t), oracle, storagetest.GroupMoneyConfig{Ops: ops, Seed: storagetest.GroupSeed(20260314), AuditEvery: 200})
}

// TestRewardMoneyMySQL is the reward wallet's money test (storagetest.RewardMoney)
// against storage.MySQL: random issues, retries, deposits, withdrawals with
// their forced booking, takes and bookings over three stages and two
// databases, COMMITs cut by the harness's proxy, every answer and the books
// held to an oracle. REDCELL_REWARD_OPS sets the number of ops (10,000 by
// default, 1,000 under the race detector); REDCELL_REWARD_SEED replays a seed.
func TestRewardMoneyMySQL(t *testing.T) {
	testenv.MySQLDSN(t, 1)
	ops := 10_000
	if raceEnabled {
		ops = 1_000
	}
	if v := os.Getenv("REDCELL_REWARD_OPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("REDCELL_REWARD_OPS=%q: want a positive number of ops", v)
		}
		ops = n
	}
	storagetest.RewardMoney(t, mysqlHarness(t), storagetest.RewardMoneyConfig{Ops: ops, Seed: storagetest.RewardSeed(20260314), CheckEvery: 500})
}

// rowClock is the harness's manual clock for the times the store writes and
// compares (rows, expiry), and real time for its waits: a retry backoff
// (settling a lost COMMIT, a Ledger re-read) must not wait for a test to
// move the clock.
type rowClock struct{ *clock.Manual }

// After waits d of real time.
func (rowClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
