package cell_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"redcell/internal/testaudit"
	"redcell/internal/testenv"
)

// TestMain ends the package with the closing audit of both test servers,
// every namespace in both spaces (internal/testaudit): the package's cells
// share the servers, and a credit booked twice fails the package even when
// every test passed.
func TestMain(m *testing.M) { os.Exit(testaudit.Main(m, "redcell/cell")) }

// layouts tracks which cells, by shards and test server, the package's
// tests have run since the last settle (see settleForLayout).
var layouts struct {
	sync.Mutex
	last  map[string]bool // "shards@server" of the cells started since the last settle
	lastT *testing.T      // the test that started the last cell
}

// settleForLayout settles the test servers (testaudit.Settle: the relay
// positions past the claims credited, reconciliation positions forgotten)
// before a cell owning shards on test server dbN starts, when no cell of
// that ownership on that server ran since the last settle: a cell of another
// layout (cell-a 0-499 on server 1 after the solo cell 0-999 there, say)
// would read again a claim an earlier layout credited past its saved
// position, deliver it to another cell on the other server, and book it
// twice. Cells of one layout deliver such a claim to the cell that booked
// it, which books it once.
func settleForLayout(t *testing.T, shards string, dbN int) {
	t.Helper()
	key := fmt.Sprintf("%s@%d", shards, dbN)
	layouts.Lock()
	defer layouts.Unlock()
	first := layouts.lastT != t // the test's first cell: a new layout may begin
	layouts.lastT = t
	if layouts.last[key] {
		return
	}
	dsns := testaudit.TestServers()
	if dsns == nil {
		return // the cell's start skips (or fails in CI) without servers
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := testaudit.Settle(ctx, dsns)
	if err != nil {
		t.Fatalf("settle the test servers before %s: %v", key, err)
	}
	if n > 0 {
		t.Logf("moved %d relay positions past the claims earlier layouts credited", n)
	}
	if first || layouts.last == nil {
		layouts.last = map[string]bool{}
	}
	layouts.last[key] = true
}

// private holds the database name prefix of each test that keeps databases
// of its own (privateDatabases), by test.
var private sync.Map // *testing.T -> string

// privateDatabases gives the cells the test starts from now on databases of
// their own on both test servers, named with a fresh prefix
// (storage.OpenPrefixed; testCell.ns), and drops them when the test ends:
// for tests that leave differences on purpose (planted faults, dropped
// shadow databases), whose rows must never meet another test's cells or the
// closing audit. It answers the prefix.
func privateDatabases(t *testing.T) string {
	t.Helper()
	p := testaudit.PrivatePrefix(t, testenv.MySQLDSN(t, 1), testenv.MySQLDSN(t, 2))
	private.Store(t, p)
	t.Cleanup(func() { private.Delete(t) })
	return p
}

// privatePrefix is the prefix privateDatabases gave t, or "".
func privatePrefix(t *testing.T) string {
	if p, ok := private.Load(t); ok {
		return p.(string)
	}
	return ""
}
