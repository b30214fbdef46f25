package cell_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"redcell/api"
	"redcell/cell"
	"redcell/internal/clock"
	"redcell/internal/testenv"
	"redcell/model"
)

// TestOpenQueueWaitShed: opens that waited longer than QueueWaitMax (500
// ms) in their packet's FIFO are shed 503 OVERLOADED and counted as
// queue_wait, apart from an open refused because the FIFO was full
// (queue_full); a shed open leaves no claim, the open that was in its
// transaction meanwhile gets its one claim. The cell runs on a manual clock,
// so "waited 501 ms" is exact; the open in the transaction is held by the
// test's own lock on the packet row.
func TestOpenQueueWaitShed(t *testing.T) {
	clk := clock.NewManual(time.Now())
	c := oneCell(t, func(cfg *cell.Config) {
		cfg.Clock = clk
		cfg.OpenStrategy = cell.StrategyBatched // the per-packet FIFO and a transaction of the worker's own
		cfg.QueueDepth = 3
		cfg.QueueWaitMax = 500 * time.Millisecond
	})
	pre := testenv.Prefix()
	sender := pre + "-s"
	c.deposit(t, sender, 1000)
	id := c.send(t, sender, 1000, 10, "qw-1")
	ref, err := model.ParsePacketID(id)
	if err != nil {
		t.Fatal(err)
	}
	shed := func(reason string) float64 {
		return counter(t, c.reg, "redcell_cell_shed_total", map[string]string{"reason": reason})
	}

	// Hold the packet row: the worker's transaction for the first open waits
	// on it, and the next opens wait in the FIFO behind it.
	ctx := context.Background()
	tx, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var left int64
	if err := tx.QueryRow(fmt.Sprintf("SELECT remaining_count FROM db_%02d.t_packet_%d_%02d WHERE packet_id = ? FOR UPDATE",
		ref.Shard.DB(), ref.Shard.Table(), ref.Day), id).Scan(&left); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		act    string
		status int
		code   string
		claim  api.OpenResponse
	}
	answers := make(chan answer, 4)
	open := func(act string) {
		a := answer{act: act}
		a.status, a.code = call(t, "POST", c.url+"/v1/packets/"+id+"/open", api.ActRequest{ActID: act}, &a.claim)
		answers <- a
	}
	first := pre + "-u0"
	go open(first)
	// The worker's locking read of the packet row shows in the process list
	// while it waits for the test's lock (MariaDB lists it in
	// information_schema.innodb_trx only once it holds a lock).
	waitFor(t, 20*time.Second, func() bool {
		var n int
		if err := c.db.QueryRow("SELECT COUNT(*) FROM information_schema.processlist WHERE info LIKE ? AND info NOT LIKE '%processlist%'",
			"%SELECT %"+id+"%FOR UPDATE%").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}, "the first open's transaction waiting for the packet row")
	queued := []string{pre + "-u1", pre + "-u2", pre + "-u3"}
	for _, act := range queued {
		go open(act)
	}
	waitFor(t, 20*time.Second, func() bool {
		return counter(t, c.reg, "redcell_cell_open_queue_depth", nil) == 3
	}, "three opens in the packet's FIFO")
	clk.Advance(501 * time.Millisecond)

	// The FIFO is full: the next open is refused at once, for that reason.
	if st, code := call(t, "POST", c.url+"/v1/packets/"+id+"/open", api.ActRequest{ActID: pre + "-u4"}, nil); st != 503 || code != "OVERLOADED" {
		t.Fatalf("open with the FIFO full: %d %s, want 503 OVERLOADED", st, code)
	}
	if full, wait := shed("queue_full"), shed("queue_wait"); full != 1 || wait != 0 {
		t.Fatalf("with the FIFO full: shed queue_full %v, queue_wait %v; want 1, 0", full, wait)
	}

	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	got := map[string]answer{}
	for range 4 {
		select {
		case a := <-answers:
			got[a.act] = a
		case <-time.After(30 * time.Second):
			t.Fatalf("answers after the lock went: %v", got)
		}
	}
	if a := got[first]; a.status != 200 || a.claim.Amount < 1 {
		t.Fatalf("the open in its transaction: %d %s %+v, want a claim", a.status, a.code, a.claim)
	}
	for _, act := range queued {
		if a := got[act]; a.status != 503 || a.code != "OVERLOADED" {
			t.Fatalf("open by %s after 501 ms in the FIFO: %d %s, want 503 OVERLOADED", act, a.status, a.code)
		}
	}
	if full, wait := shed("queue_full"), shed("queue_wait"); full != 1 || wait != 3 {
		t.Fatalf("shed queue_full %v, queue_wait %v; want 1, 3", full, wait)
	}
	for _, reason := range []string{"deadline", "no_slot", "shutting_down"} {
		if n := shed(reason); n != 0 {
			t.Fatalf("shed %s: %v, want 0", reason, n)
		}
	}

	// The rows: one claim, the first open's; the packet gave one share.
	sum, n, users := claimRows(t, c.db, id)
	if n != 1 || !users[first] || sum != got[first].claim.Amount {
		t.Fatalf("claims: %d (users %v, %d cents), want the first open's alone (%d cents)", n, users, sum, got[first].claim.Amount)
	}
	if remAmount, remCount, _, _ := packetRow(t, c.db, id); remCount != 9 || remAmount != 1000-sum {
		t.Fatalf("packet row: %d cents in %d shares left, want %d in 9", remAmount, remCount, 1000-sum)
	}

	// Leave the books settled: the relay, on the manual clock, credits the
	// claim to its wallet.
	waitFor(t, 30*time.Second, func() bool {
		clk.Advance(c.cfg.RelayInterval)
		return c.balance(t, first) == sum
	}, "the claim credited")
}
