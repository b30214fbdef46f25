package storage_test

import (
	"testing"
	"time"

	"redcell/internal/clock"
	"redcell/internal/testenv"
	"redcell/storage"
	"redcell/storage/storagetest"
)

// TestContractMySQL runs the store contract against storage.MySQL on the test
// MariaDB (make test, or deploy/local/testenv.sh); without one it skips (in
// CI it fails). The in-memory store runs the same suite in
// storage/memstore (TestContractMemory).
func TestContractMySQL(t *testing.T) {
	testenv.MySQLDSN(t, 1)
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		clk := clock.NewManual(storagetest.Start)
		m, fail, cuts := storage.ContractMySQL(t, rowClock{clk})
		return storagetest.Harness{Store: m, Clock: clk, FailNextCommit: fail, CommitFaults: cuts}
	})
}

// rowClock is the harness's manual clock for the times the store writes and
// compares (rows, expiry), and real time for its waits: a retry backoff
// (settling a lost COMMIT, a Ledger re-read) must not wait for a test to
// move the clock.
type rowClock struct{ *clock.Manual }

// After waits d of real time.
func (rowClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
