package storage_test

import (
	"testing"

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
		m, fail, cuts := storage.ContractMySQL(t, clk.Now)
		return storagetest.Harness{Store: m, Clock: clk, FailNextCommit: fail, CommitFaults: cuts}
	})
}
