package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// replicaPair starts a primary and its standby (deploy/local/services.sh,
// fast mode) in a temporary folder and returns their DSNs and a function
// that kills the primary with SIGKILL. Skips without MariaDB unless in CI.
func replicaPair(t *testing.T) (primary, standby string, killPrimary func()) {
	t.Helper()
	if _, err := os.Stat("/usr/sbin/mariadbd"); err != nil {
		if _, err := exec.LookPath("mariadbd"); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatal("the failover test needs mariadbd (make test installs it)")
			}
			t.Skip("the failover test needs mariadbd; run make test")
		}
	}
	script, _ := filepath.Abs("../deploy/local/services.sh")
	dir := t.TempDir()
	ports := make([]int, 2)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
	}
	sh := func(script2 string) {
		t.Helper()
		out, err := exec.Command("bash", "-c", ". "+script+"\nset -e\n"+script2).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", script2, err, out)
		}
	}
	t.Cleanup(func() { sh(fmt.Sprintf("stop_mariadb %[1]s/p; stop_mariadb %[1]s/s", dir)) })
	sh(fmt.Sprintf("REDCELL_REPL_ID=1 start_mariadb %[1]s/p %[2]d fast; start_standby %[1]s/s %[3]d %[2]d 11 fast", dir, ports[0], ports[1]))
	killPrimary = func() { testenv.KillPidFile(t, dir+"/p/mariadb.pid") }
	return fmt.Sprintf("root@tcp(127.0.0.1:%d)/", ports[0]), fmt.Sprintf("root@tcp(127.0.0.1:%d)/", ports[1]), killPrimary
}

// TestFailoverKeepsAcknowledgedCommits: deposits run on a primary with a
// semi-synchronous standby; the primary is killed with SIGKILL mid-stream;
// Watch promotes the standby once the primary has been silent for a while,
// and every deposit that was answered is there, exactly once, with its
// balance; deposits go on against the standby; a store opened afterwards
// serves from the promoted standby, not the dead primary's copy.
func TestFailoverKeepsAcknowledgedCommits(t *testing.T) {
	primary, standby, killPrimary := replicaPair(t)
	var logTo io.Writer = io.Discard
	if testing.Verbose() {
		logTo = os.Stderr
	}
	log := slog.New(slog.NewTextHandler(logTo, nil))
	m, f, err := OpenFailover(primary, standby, 16, log)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if f.OnStandby() {
		t.Fatal("a fresh pair serves from the standby")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watched := make(chan struct{})
	go func() { defer close(watched); f.Watch(ctx, 2*time.Second, 100*time.Millisecond) }()

	const workers, each = 8, 60
	// The shards' tables first, and the standby caught up with them: DDL
	// replays one statement at a time, and the point here is the money rows.
	for w := range workers {
		for i := range each {
			if err := m.EnsureShard(ctx, sharding.ShardOfAct(fmt.Sprintf("fo-%d-%d", w, i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := m.EnsureShard(ctx, sharding.ShardOfAct("fo-after")); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, m, standby)
	// The standby applies 4 s behind what it receives: answered deposits are
	// in its relay log, not its tables, when the primary dies, and only the
	// promotion's wait for the apply keeps them.
	sdb := rawDB(t, standby)
	if _, err := sdb.Exec("STOP SLAVE"); err != nil {
		t.Fatal(err)
	}
	if _, err := sdb.Exec("CHANGE MASTER TO MASTER_DELAY = 4"); err != nil {
		t.Fatal(err)
	}
	if _, err := sdb.Exec("START SLAVE"); err != nil {
		t.Fatal(err)
	}
	// Semi-synchronous, one standby acknowledging.
	var name, on, clients string
	_ = m.db.QueryRow("SHOW STATUS LIKE 'Rpl_semi_sync_master_status'").Scan(&name, &on)
	testenv.Until(30*time.Second, func() bool {
		err := m.db.QueryRow("SHOW STATUS LIKE 'Rpl_semi_sync_master_clients'").Scan(&name, &clients)
		return err == nil && clients == "1"
	})
	if on != "ON" || clients != "1" {
		t.Fatalf("semi-synchronous replication: status %q, clients %q; want ON with 1", on, clients)
	}
	// The watch samples the standby on its own beat: wait for its first
	// sample of the running replica (a loaded machine, under -race, may
	// take seconds) before the load, and check it again before the kill.
	if !testenv.Until(30*time.Second, func() bool { return f.Replicating() == 1 }) {
		t.Fatalf("the watch did not find the standby replicating within 30 s (replicating = %d)", f.Replicating())
	}
	var noTxBefore int64
	_ = m.db.QueryRow("SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'RPL_SEMI_SYNC_MASTER_NO_TX'").Scan(&noTxBefore)
	var mu sync.Mutex
	acked := map[string]model.Cents{} // act → cents answered
	var wg sync.WaitGroup
	killAt := make(chan struct{})
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if w == 0 && i == each/3 {
					close(killAt)
				}
				act := fmt.Sprintf("fo-%d-%d", w, i)
				dctx, dcancel := context.WithTimeout(ctx, 500*time.Millisecond)
				_, err := Deposit(dctx, m, sharding.ShardOfAct(act), act, "dep-"+act, model.Cents(100+i))
				dcancel()
				if err == nil {
					mu.Lock()
					acked[act] = model.Cents(100 + i)
					mu.Unlock()
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	<-killAt
	// The kill comes while deposits are answered: some in its last moment,
	// not applied yet on the standby.
	mu.Lock()
	ackedAtKill := len(acked)
	mu.Unlock()
	testenv.WaitFor(t, 30*time.Second, "20 more deposits answered before the kill", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(acked) >= ackedAtKill+20
	})
	var noTx int64
	_ = m.db.QueryRow("SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'RPL_SEMI_SYNC_MASTER_NO_TX'").Scan(&noTx)
	if noTx != noTxBefore {
		t.Fatalf("%d commits answered without the standby's acknowledgement", noTx-noTxBefore)
	}
	if r := f.Replicating(); r != 1 {
		t.Fatalf("the watch found the standby replicating = %d before the kill, want 1", r)
	}
	killPrimary()
	killed := time.Now()
	wg.Wait()
	if !testenv.Until(30*time.Second, f.OnStandby) {
		t.Fatal("the standby was not promoted within 30 s of the primary's death")
	}
	promotedAfter := time.Since(killed)
	<-watched // Watch ends once the standby serves
	if promotedAfter < 2*time.Second {
		t.Fatalf("promoted %s after the kill, before the primary was silent for 2 s", promotedAfter)
	}
	if f.Replicating() != -1 {
		t.Fatalf("after the promotion the standby replicating reads %d, want -1 (none)", f.Replicating())
	}
	if f.Promotions.Load() != 1 {
		t.Fatalf("%d promotions", f.Promotions.Load())
	}
	if len(acked) < workers*each/4 {
		t.Fatalf("only %d deposits answered before the kill", len(acked))
	}
	// Every answered deposit is on the promoted standby, once.
	for act, cents := range acked {
		var a model.Account
		var err error
		testenv.Until(10*time.Second, func() bool { // the pool drops the old primary's connections as it meets them
			a, err = Account(ctx, m, sharding.ShardOfAct(act), act)
			return err == nil
		})
		if err != nil || a.Balance != cents {
			t.Fatalf("acknowledged deposit of %d to %s: account %+v, %v after the failover", cents, act, a, err)
		}
	}
	// Writes go on, on the standby.
	var derr error
	testenv.Until(10*time.Second, func() bool {
		_, derr = Deposit(ctx, m, sharding.ShardOfAct("fo-after"), "fo-after", "dep-fo-after", 777)
		return derr == nil
	})
	if derr != nil {
		t.Fatalf("a deposit after the failover: %v", derr)
	}
	// A later process (a cell restarted) serves from the promoted standby.
	m2, f2, err := OpenFailover(primary, standby, 4, log)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if !f2.OnStandby() {
		t.Fatal("a store opened after the promotion serves from the old primary")
	}
	if a, err := Account(ctx, m2, sharding.ShardOfAct("fo-after"), "fo-after"); err != nil || a.Balance != 777 {
		t.Fatalf("the deposit after the failover, read by a new store: %+v, %v", a, err)
	}
	t.Logf("%d deposits answered (of %d tried), all on the standby; promoted %s after the primary's SIGKILL (failover after 2 s of silence)",
		len(acked), workers*each, promotedAfter.Round(time.Millisecond))
}

// waitCaughtUp waits until the standby has applied everything the primary
// (m's server) has written.
func waitCaughtUp(t *testing.T, m *MySQL, standby string) {
	t.Helper()
	var pos string
	if err := m.db.QueryRow("SELECT @@gtid_binlog_pos").Scan(&pos); err != nil {
		t.Fatal(err)
	}
	full, err := withParams(standby)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", full)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var waited sql.NullInt64
	if err := db.QueryRow("SELECT MASTER_GTID_WAIT(?, 120)", pos).Scan(&waited); err != nil || waited.Int64 != 0 {
		t.Fatalf("the standby did not catch up with %s within 120 s: %v %v", pos, waited, err)
	}
}

// rawDB opens dsn with the store's driver parameters.
func rawDB(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	full, err := withParams(dsn)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", full)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestFailoverRefusesAnUnknownStandby: a standby that is neither a replica
// of the primary nor marked as promoted (here: a fresh server, and one
// pointed at another primary) is refused, never taken for the cell's
// database; one that does not answer is refused after standbyWait.
func TestFailoverRefusesAnUnknownStandby(t *testing.T) {
	primary, standby, _ := replicaPair(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	// Pointed at another server: not this primary's replica.
	sdb := rawDB(t, standby)
	for _, q := range []string{"STOP SLAVE", "CHANGE MASTER TO MASTER_PORT = 1", "START SLAVE"} {
		if _, err := sdb.Exec(q); err != nil {
			t.Fatal(q, err)
		}
	}
	if _, _, err := OpenFailover(primary, standby, 2, log); !errors.Is(err, ErrStandbyUnknown) {
		t.Fatalf("a standby replicating from elsewhere: %v, want ErrStandbyUnknown", err)
	}
	// Replicating from nobody, unmarked (a fresh or half-seeded server).
	for _, q := range []string{"STOP SLAVE", "RESET SLAVE ALL"} {
		if _, err := sdb.Exec(q); err != nil {
			t.Fatal(q, err)
		}
	}
	if _, _, err := OpenFailover(primary, standby, 2, log); !errors.Is(err, ErrStandbyUnknown) {
		t.Fatalf("a standby replicating from nobody, unmarked: %v, want ErrStandbyUnknown", err)
	}
	// Not answering.
	defer func(w time.Duration) { standbyWait = w }(standbyWait)
	standbyWait = 2 * time.Second
	if _, _, err := OpenFailover(primary, "root@tcp(127.0.0.1:1)/", 2, log); err == nil || !strings.Contains(err.Error(), "did not answer") {
		t.Fatalf("a standby that does not answer: %v", err)
	}
}

// TestPromoteRefusedWhenLeaseLost: a process whose lease another process of
// the cell took (the lease row on the standby, replicated from the primary,
// names a newer generation) does not promote the standby, nor switch back:
// it hung and lost the cell; the standby stays the primary's replica.
func TestPromoteRefusedWhenLeaseLost(t *testing.T) {
	primary, standby, _ := replicaPair(t)
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	_, f, err := OpenFailover(primary, standby, 2, log)
	if err != nil {
		t.Fatal(err)
	}
	pdb := rawDB(t, primary)
	if err := EnsureLease(ctx, pdb); err != nil {
		t.Fatal(err)
	}
	ours, ok, _, _, err := TakeLease(ctx, pdb, "cell-x", "cell-x/a", "a", time.Minute)
	if err != nil || !ok {
		t.Fatalf("lease: %v %v", ok, err)
	}
	f.SetLease(ours)
	// Another process takes it (same slot: at once), a newer generation,
	// which replicates to the standby.
	if _, ok, _, _, err := TakeLease(ctx, pdb, "cell-x", "cell-x/a", "a again", time.Minute); err != nil || !ok {
		t.Fatalf("the other process's lease: %v %v", ok, err)
	}
	var pos string
	if err := pdb.QueryRow("SELECT @@gtid_binlog_pos").Scan(&pos); err != nil {
		t.Fatal(err)
	}
	sdb := rawDB(t, standby)
	var waited sql.NullInt64
	if err := sdb.QueryRow("SELECT MASTER_GTID_WAIT(?, 60)", pos).Scan(&waited); err != nil || waited.Int64 != 0 {
		t.Fatalf("the standby did not catch up: %v %v", waited, err)
	}
	if err := f.Promote(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("promotion by a process that lost its lease: %v, want ErrLeaseLost", err)
	}
	if f.OnStandby() {
		t.Fatal("promoted anyway")
	}
	if st, err := slaveStatus(ctx, sdb); err != nil || st == nil || st["Slave_IO_Running"] != "Yes" {
		t.Fatalf("the standby after a refused promotion: %v %v", st["Slave_IO_Running"], err)
	}
	// With the lease ours again, the same standby is promoted.
	f.SetLease(Lease{Cell: "cell-x", Generation: 2})
	if err := f.Promote(ctx); err != nil || !f.OnStandby() {
		t.Fatalf("promotion with the lease: %v, on standby %v", err, f.OnStandby())
	}
}
