package memstore

import (
	"testing"

	"redcell/storage/storagetest"
)

// TestRewardMoney is the reward wallet's money test against the in-memory
// store: 10,000 random issue, retry, deposit, withdraw, take and book ops
// over three stages with COMMIT faults, every answer and the books held to
// an oracle. The MariaDB store runs it in storage/contract_test.go
// (TestRewardMoneyMySQL). Under the race detector (make race) it runs 1,000
// ops: one goroutine drives the store, and make unit runs all of them.
func TestRewardMoney(t *testing.T) {
	h, _ := harness()
	ops := 10_000
	if raceEnabled {
		ops = 1_000
	}
	storagetest.RewardMoney(t, h, storagetest.RewardMoneyConfig{Ops: ops, Seed: storagetest.RewardSeed(20260314), CheckEvery: 200})
}
