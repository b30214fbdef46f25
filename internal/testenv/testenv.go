// Package testenv gives tests the real MariaDB and memcached that
// deploy/local/testenv.sh (make test) starts, and free loopback ports. Outside
// CI a test without the servers skips; in CI (CI set) it fails, so nothing real
// is ever silently skipped there.
package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
)

func need(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI must provide %s (run the tests through make test)", name)
		}
		t.Skipf("set %s or run make test", name)
	}
	return v
}

// MySQLDSN returns the DSN of test database server n (1 or 2).
func MySQLDSN(t testing.TB, n int) string {
	return need(t, fmt.Sprintf("REDCELL_TEST_MYSQL_DSN_%d", n))
}

// Memcached returns the test memcached address.
func Memcached(t testing.TB) string { return need(t, "REDCELL_TEST_MEMCACHED") }

// Prefix returns a fresh prefix for act_ids and order numbers, so tests sharing
// one database never touch each other's rows.
func Prefix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "t" + hex.EncodeToString(b[:])
}
