package storage_test

import (
	"os"
	"testing"

	"redcell/internal/testaudit"
)

// TestMain ends the package with the closing audit of both test servers
// (internal/testaudit): its tests write money rows there, and leave no
// difference (the contract suite and the tests that break books on purpose
// use name prefixes of their own, dropped when they end).
func TestMain(m *testing.M) { os.Exit(testaudit.Main(m, "redcell/storage")) }
