package memstore

import (
	"testing"

	"redcell/storage/storagetest"
)

// TestGroupMoney is issue 9's money test against the in-memory store: 10,000
// mixed ops through CommitGroup, one injected failure per group (duplicate
// order number, insufficient balance, sold out, a COMMIT that fails, a
// wallet held by another transaction, a COMMIT whose answer is lost), every
// answer the single-op oracle's, the books alike and clean. The MariaDB
// store runs it in storage/contract_test.go (TestGroupMoneyMySQL).
func TestGroupMoney(t *testing.T) {
	h, _ := harness()
	oracle, _ := harness()
	storagetest.GroupMoney(t, h, oracle, storagetest.GroupMoneyConfig{Ops: 10_000, Seed: storagetest.GroupSeed(20260314), AuditEvery: 100})
}
