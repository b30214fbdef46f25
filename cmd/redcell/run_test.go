package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"redcell/internal/testenv"
)

// TestMakeRunStops starts `make run` as a user does (its own REDCELL_VAR and
// router port) and stops it the ways a terminal and a supervisor do, to the
// whole process group as they send it:
//   - SIGTERM twice (GNU make forwards a TERM of its own to run.sh as well):
//     the orderly stop runs to the end — both cells drain ("cell stopped"),
//     both MariaDB servers shut down cleanly — and no process is left when
//     make returns;
//   - a second start on the same state serves the money of the first (the
//     deposit, the demo API key); SIGHUP, then SIGINT during that shutdown:
//     the same orderly end;
//   - a third start, then SIGKILL to the group: run.sh cannot stop anything,
//     so its watchdog does, in order, and nothing is left.
//
// The first start also proves a fresh machine's first run prints no failure:
// two MariaDB bootstraps run at once, and each keeps to its own tmpdir (a
// bootstrap deletes every "#sql*" file of its tmpdir: with a shared /tmp
// they deleted each other's temporary tables and one failed); a file of that
// name planted in the shared temp dir survives.
func TestMakeRunStops(t *testing.T) {
	needServers(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "var")
	port := freePorts(t, 1)[0]
	// make run's temp dir ($TMPDIR, which a bootstrap takes by default) is the
	// test's own, so that nothing else on the machine touches the file planted there.
	tmp := t.TempDir()
	var b [6]byte
	_, _ = rand.Read(b[:])
	sentinel := filepath.Join(tmp, "#sql-redcell-probe-"+hex.EncodeToString(b[:]))
	if err := os.WriteFile(sentinel, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	states := []string{state}
	t.Cleanup(func() { // whatever happened, leave nothing running
		for _, st := range states {
			if left := processesUnder(st); len(left) > 0 {
				exec.Command("bash", "-c", ". "+root+"/deploy/local/services.sh; stop_cluster "+st).Run()
			}
		}
	})

	// 1: a fresh state; TERM twice.
	run := startMakeRun(t, root, state, tmp, port, 5*time.Minute)
	if bad := regexp.MustCompile(`(?i).*(fail|error).*`).FindAllString(run.out.String(), -1); len(bad) > 0 {
		t.Errorf("a first make run printed failures:\n%s", strings.Join(bad, "\n"))
	}
	if _, err := os.Stat(sentinel); err != nil {
		t.Errorf("a MariaDB bootstrap deleted %s from the shared temp dir: %v", sentinel, err)
	}
	key := readKey(t, state)
	if st, body := routerCall(t, port, key, "POST", "/v1/accounts/runtest/deposit", `{"amount":4200,"order_no":"run-1"}`); st != 200 {
		t.Fatalf("deposit: %d %s", st, body)
	}
	run.signal(t, syscall.SIGTERM, syscall.SIGTERM)
	run.waitStopped(t, state, 1)
	// Other apps' keys beside the demo key: the next start must still find
	// the demo key among them, not make another (a check that read only the
	// first lines once made a new one about a time in three).
	bin := filepath.Join(state, "bin", "redcell")
	for i := range 40 {
		if out, err := exec.Command(bin, "apikey", "add", "--keys", filepath.Join(state, "api-keys.yaml"),
			"--app", fmt.Sprintf("app%d", i), "--scopes", "read").CombinedOutput(); err != nil {
			t.Fatalf("apikey add: %v\n%s", err, out)
		}
	}

	// 2: the same state again: the money and the key are still there; HUP, then INT.
	run = startMakeRun(t, root, state, tmp, port, 2*time.Minute)
	if k := readKey(t, state); k != key {
		t.Errorf("a second make run made another API key")
	}
	if out, _ := exec.Command(bin, "apikey", "list", "--keys", filepath.Join(state, "api-keys.yaml")).Output(); strings.Count(string(out), "app=demo") != 1 {
		t.Errorf("the demo app has other keys than the first:\n%s", out)
	}
	if st, body := routerCall(t, port, key, "GET", "/v1/accounts/runtest", ""); st != 200 || !strings.Contains(body, `"balance":4200`) {
		t.Fatalf("the deposit after a restart: %d %s", st, body)
	}
	run.signal(t, syscall.SIGHUP, syscall.SIGINT)
	run.waitStopped(t, state, 2)

	// 3: SIGKILL to the whole group: the watchdog stops the cluster.
	run = startMakeRun(t, root, state, tmp, port, 2*time.Minute)
	start := time.Now()
	_ = syscall.Kill(-run.cmd.Process.Pid, syscall.SIGKILL)
	<-run.done
	for left := processesUnder(state); len(left) > 0; left = processesUnder(state) {
		if time.Since(start) > 90*time.Second {
			t.Fatalf("90 s after SIGKILL to make run's group these still run:\n%s", strings.Join(left, "\n"))
		}
		time.Sleep(250 * time.Millisecond)
	}
	wd, _ := os.ReadFile(filepath.Join(state, "log", "watchdog.log"))
	if !strings.Contains(string(wd), "stopped.") {
		t.Errorf("the watchdog did not stop the cluster; its log:\n%s", wd)
	}
	checkOrderly(t, state, 3)
	t.Logf("after SIGKILL to make run's group, the watchdog stopped everything in %s", time.Since(start).Round(100*time.Millisecond))

	// 4: SIGTERM to run.sh alone (as a supervisor signals its main process)
	// while its MariaDB servers are set up on a fresh state: the stop waits
	// for them and stops them, so nothing is left when make returns.
	state = filepath.Join(t.TempDir(), "var")
	states = append(states, state)
	run = startMakeRunUntil(t, root, state, tmp, port, 2*time.Minute, "starting MariaDB")
	script := childRunning(t, run.cmd.Process.Pid, "deploy/local/run.sh")
	if err := syscall.Kill(script, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-run.done:
	case <-time.After(120 * time.Second):
		t.Fatalf("make run still runs 120 s after TERM to run.sh:\n%s", run.out.String())
	}
	if left := processesUnder(state); len(left) > 0 {
		t.Fatalf("TERM to run.sh while MariaDB started left these running:\n%s\noutput:\n%s", strings.Join(left, "\n"), run.out.String())
	}
}

// childRunning returns the pid of the child of parent whose command line
// contains text, waiting up to 10 s for it.
func childRunning(t *testing.T, parent int, text string) int {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
			if err != nil {
				continue
			}
			fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
			if len(fields) < 2 || fields[1] != strconv.Itoa(parent) {
				continue
			}
			if cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline"); bytes.Contains(cmdline, []byte(text)) {
				return pid
			}
		}
	}
	t.Fatalf("no child of %d runs %s", parent, text)
	return 0
}

// needServers skips (outside CI) or fails (in CI) without MariaDB and memcached installed.
func needServers(t *testing.T) {
	t.Helper()
	for _, bin := range []string{"mariadbd", "memcached", "mariadb-install-db"} {
		if _, err := exec.LookPath(bin); err == nil {
			continue
		}
		if _, err := os.Stat("/usr/sbin/" + bin); err == nil {
			continue
		}
		if os.Getenv("CI") != "" {
			t.Fatalf("this test needs %s (make test installs it)", bin)
		}
		t.Skipf("this test needs %s; run make test", bin)
	}
}

type makeRun struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{} // closed when make has exited
}

// startMakeRun runs `make run` in a process group of its own and waits up to
// limit for it to say it serves.
func startMakeRun(t *testing.T, root, state, tmp string, port int, limit time.Duration) *makeRun {
	t.Helper()
	return startMakeRunUntil(t, root, state, tmp, port, limit, "redcell is serving.")
}

// startMakeRunUntil is startMakeRun that waits until the output holds until.
func startMakeRunUntil(t *testing.T, root, state, tmp string, port int, limit time.Duration, until string) *makeRun {
	t.Helper()
	cmd := exec.Command("make", "--no-print-directory", "-C", root, "run")
	// One tablespace for all tables (REDCELL_FILE_PER_TABLE=0): the cells create
	// some 6,000 day tables at first start, which this test does not need to wait for.
	cmd.Env = append(os.Environ(), "REDCELL_VAR="+state, "REDCELL_ROUTER_PORT="+strconv.Itoa(port), "TMPDIR="+tmp, "REDCELL_FILE_PER_TABLE=0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	r := &makeRun{cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = r.out, r.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(r.done) }()
	for start := time.Now(); !strings.Contains(r.out.String(), until); time.Sleep(50 * time.Millisecond) {
		select {
		case <-r.done:
			t.Fatalf("make run exited before it printed %q:\n%s", until, r.out.String())
		default:
		}
		if time.Since(start) > limit {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
			<-r.done
			t.Fatalf("make run did not print %q within %s:\n%s", until, limit, r.out.String())
		}
	}
	return r
}

// signal sends first, then 300 ms later second, to make run's process group,
// as a supervisor or a terminal does.
func (r *makeRun) signal(t *testing.T, first, second syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(-r.cmd.Process.Pid, first); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	_ = syscall.Kill(-r.cmd.Process.Pid, second)
}

// waitStopped waits for make to return, then requires that nothing of the
// cluster runs any more and that the stop was the orderly one (the nth).
func (r *makeRun) waitStopped(t *testing.T, state string, nth int) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(120 * time.Second):
		t.Fatalf("make run still runs 120 s after the signals:\n%s", r.out.String())
	}
	if left := processesUnder(state); len(left) > 0 {
		t.Fatalf("make run returned with these still running:\n%s\noutput:\n%s", strings.Join(left, "\n"), r.out.String())
	}
	if !strings.Contains(r.out.String(), "\nstopped.") {
		t.Errorf("run.sh did not finish its shutdown:\n%s", r.out.String())
	}
	checkOrderly(t, state, nth)
}

// checkOrderly requires the nth graceful stop in each cell's log and a clean
// shutdown of each MariaDB (crash recovery would be needed otherwise).
func checkOrderly(t *testing.T, state string, nth int) {
	t.Helper()
	for _, c := range []string{"cell-1", "cell-2"} {
		log, _ := os.ReadFile(filepath.Join(state, "log", c+".log"))
		if n := strings.Count(string(log), `msg="cell stopped"`); n != nth {
			t.Errorf("%s stopped gracefully %d times, want %d; its log ends:\n%s", c, n, nth, tail(log, 10))
		}
		dblog, _ := os.ReadFile(filepath.Join(state, c, "db", "error.log"))
		if n := strings.Count(string(dblog), "mariadbd: Shutdown complete"); n != nth {
			t.Errorf("%s's MariaDB shut down cleanly %d times, want %d; its log ends:\n%s", c, n, nth, tail(dblog, 10))
		}
	}
}

func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// processesUnder lists the processes whose command line names dir.
func processesUnder(dir string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(cmdline, []byte(dir)) {
			continue
		}
		out = append(out, fmt.Sprintf("%d %s", pid, bytes.ReplaceAll(bytes.TrimRight(cmdline, "\x00"), []byte{0}, []byte{' '})))
	}
	return out
}

func readKey(t *testing.T, state string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(state, "api-key"))
	if err != nil {
		t.Fatalf("make run wrote no API key: %v", err)
	}
	return strings.TrimSpace(string(b))
}

// routerCall sends one request to the router of make run with the API key.
func routerCall(t *testing.T, port int, key, method, path, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, fmt.Sprintf("http://127.0.0.1:%d%s", port, path), rd)
	req.Header.Set("Authorization", "Bearer "+key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, b := testenv.Do(t, nil, req)
	return resp.StatusCode, string(b)
}
