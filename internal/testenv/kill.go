package testenv

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// KillPidFile sends SIGKILL to the process whose pid the file at path holds
// (a MariaDB's mariadb.pid) and returns the pid; it fails t when the file
// cannot be read or holds no pid. It does not wait for the process to end.
func KillPidFile(t testing.TB, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid <= 0 {
		t.Fatalf("bad pid file %q", b)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	return pid
}
