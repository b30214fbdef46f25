package main

import (
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// takeoverDrill runs a cell as a SET of two processes (storage.Lease): on a
// cluster of its own, cell-1 runs a second process (slot b, its own HTTP,
// gossip and admin ports) that waits for the lease. Under the drill load:
//
//  1. the serving process (slot a) is killed with SIGKILL: slot b takes the
//     lease once it expires (lease_ttl 4 s) and serves; the router follows
//     through membership, within 10 s of the kill;
//  2. slot a is started again: it waits (the lease is b's, renewed);
//  3. slot b hangs (SIGSTOP): its lease expires, slot a takes it, ends b's
//     connections and serves; b, continued (SIGCONT), finds the lease lost
//     at its next renewal, leaves the cluster and exits, its connections
//     refused meanwhile.
//
// The load's verify (every answered send, claim and credit there once: no
// operation applied twice) and the audit end it.
func takeoverDrill(t *testing.T, loadFor time.Duration, workers int, maxOps int64) {
	d := startDrillDeps(t)
	c := startClusterSpec(t, clusterSpec{dsn: [2]string{d.dsn(0), d.dsn(1)}, mc: fmt.Sprintf("127.0.0.1:%d", d.mcPort), cell: drillCell})
	c.waitSchema(t)
	p := freePorts(t, 3)
	second := []string{"cell", "--config", c.config, "--name", "cell-1", "--proc", "b",
		"--listen", fmt.Sprintf("127.0.0.1:%d", p[0]), "--gossip", fmt.Sprintf("127.0.0.1:%d", p[1]), "--admin-listen", fmt.Sprintf("127.0.0.1:%d", p[2])}
	c.start(t, "cell-1b", second...)
	t.Cleanup(func() { c.stop(t, "cell-1b") })
	waitLog(t, c, "cell-1b", "waiting to take over", 30*time.Second)

	cell1Act := actIn("probe-a", 0, 499)
	l := newDrillLoad(t, c, "tk"+randHex(), 12, 300)
	done, stop := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); l.runUntil(workers, stop, 20*loadFor, maxOps) }()
	time.Sleep(loadFor / 3)

	// 1. The serving process dies.
	c.kill(t, "cell-1")
	killed := time.Now()
	again := waitServes(t, c, cell1Act, 60*time.Second)
	took := time.Since(killed)
	waitLog(t, c, "cell-1b", "lease taken", 10*time.Second)
	time.Sleep(loadFor / 3)

	// 2. Slot a comes back: it waits for b's lease.
	c.restart(t, "cell-1")
	waitLog(t, c, "cell-1", "waiting to take over", 30*time.Second)

	// 3. Slot b hangs; slot a takes over; b, woken, stops.
	c.signal(t, "cell-1b", syscall.SIGSTOP)
	hung := time.Now()
	waitLog(t, c, "cell-1", "lease taken", 30*time.Second)
	overAgain := waitServes(t, c, cell1Act, 60*time.Second)
	tookHung := time.Since(hung)
	time.Sleep(loadFor / 3)
	c.signal(t, "cell-1b", syscall.SIGCONT)
	exited := c.waitExit(t, "cell-1b", 30*time.Second)
	time.Sleep(loadFor / 3)
	close(stop)
	<-done
	if t.Failed() {
		return
	}
	if !strings.Contains(c.log("cell-1b"), "lease lost") || exited == nil {
		t.Fatalf("cell-1b (slot b) woke after its lease was taken but did not stop for it (exit %v):\n%s", exited, lastLines(c.log("cell-1b"), 20))
	}
	if took > 10*time.Second {
		t.Errorf("cell-1 served again %s after its serving process's kill, target 10 s", took.Round(time.Millisecond))
	}
	t.Logf("cell_takeover: slot a killed, slot b served cell-1's shards %s after the kill (waitServes %s); slot b hung, slot a served %s after (waitServes %s); b woke and stopped (%v); %s; opens by answer: %v",
		took.Round(time.Millisecond), again.Round(time.Millisecond), tookHung.Round(time.Millisecond), overAgain.Round(time.Millisecond), exited,
		l.verify(t), l.codes(time.Time{}, time.Now().Add(time.Hour)))
}

// waitLog waits up to limit for a process's log to hold text.
func waitLog(t *testing.T, c *cluster, name, text string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !strings.Contains(c.log(name), text) {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not log %q within %s:\n%s", name, text, limit, lastLines(c.log(name), 20))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// running is the cluster's process name; the test fails when none runs.
func (c *cluster) running(t *testing.T, name string) *exec.Cmd {
	t.Helper()
	c.mu.Lock()
	cmd := c.procs[name]
	c.mu.Unlock()
	if cmd == nil {
		t.Fatalf("%s is not running", name)
	}
	return cmd
}

// signal sends sig to a running process of the cluster.
func (c *cluster) signal(t *testing.T, name string, sig syscall.Signal) {
	t.Helper()
	if err := c.running(t, name).Process.Signal(sig); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// waitExit waits up to limit for a process of the cluster to exit by
// itself, and returns its exit error (nil: it did not exit, or exited 0 —
// the caller tells these apart by the log).
func (c *cluster) waitExit(t *testing.T, name string, limit time.Duration) error {
	t.Helper()
	cmd := c.running(t, name)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		c.take(name)
		if err == nil {
			err = fmt.Errorf("exit status 0")
		}
		return err
	case <-time.After(limit):
		t.Fatalf("%s did not exit within %s of waking:\n%s", name, limit, lastLines(c.log(name), 20))
		return nil
	}
}
