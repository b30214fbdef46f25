package memstore

import (
	"testing"

	"redcell/internal/clock"
	"redcell/storage/storagetest"
)

// TestContractMemory runs the store contract against the in-memory store; it
// needs nothing and runs everywhere. storage.MySQL runs the same suite
// (storage/contract_test.go, TestContractMySQL).
func TestContractMemory(t *testing.T) {
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		clk := clock.NewManual(storagetest.Start)
		s := New(clk)
		return storagetest.Harness{Store: s, Clock: clk, FailNextCommit: s.FailNextCommit, CommitFaults: s.CommitFaults, PutFlow: s.putFlow, HoldWallet: s.HoldWallet}
	})
}
