package cell_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"redcell/api"
	"redcell/cell"
	"redcell/internal/testenv"
	"redcell/sharding"
)

// TestBookerWaitsForItsRateOutsideTheTransaction: a booker whose batch
// waits longer for booking_rate than a transaction's 5 s timeout still books
// it once the rate allows. booking_rate 2/s, batches of 12, 24 rewards
// issued with the booking off: switched on, the first batch spends the
// burst and the second waits 6 s for its tokens. Once, the take's timeout
// also covered that wait and the booking behind it: the batch failed ("begin:
// context deadline exceeded") and stayed processing for 30 s (bookerStale).
// Now a batch is booked first and its tokens are waited for after.
// It takes 6 s, so make race leaves it to make unit.
func TestBookerWaitsForItsRateOutsideTheTransaction(t *testing.T) {
	if raceEnabled {
		t.Skip("6 s of waiting for a rate: make unit runs it")
	}
	pre := strings.ReplaceAll(testenv.Prefix(), "_", "-")
	c, _ := rewardCell(t, pre, false, func(cfg *cell.Config) { cfg.BookingRate, cfg.BookingBatch = 2, 12 })
	setDegrade(t, c, api.DegradeSetting{Booking: "off"})
	act := pre + "_slow"
	for i := range 24 {
		req := api.RewardRequest{ParentActivityID: pre + "-fest", SceneID: pre + "-rain", RainID: fmt.Sprintf("s%d", i), ActID: act, AwardType: "cash", Amount: 1}
		if _, st, code := issue(t, c, req); st != 200 {
			t.Fatalf("issue %d: %d %s", i, st, code)
		}
	}
	setDegrade(t, c, api.DegradeSetting{Booking: "on"})
	start := time.Now()
	// 12 s of tokens at most (and what earlier tests left pending in the
	// shared database, which this cell books too), well below the 30 s a
	// failed batch waits.
	if testenv.Until(20*time.Second, func() bool {
		w := walletOf(t, c, act, "official")
		return w.Pending == 0 && w.Balance == 24
	}) {
		t.Logf("24 rewards booked %s after the booking was switched on", time.Since(start).Round(100*time.Millisecond))
		return
	}
	t.Fatalf("20 s after the booking was switched on: %+v", walletOf(t, c, act, "official"))
}

// TestBookerBooksAnIssueDuringItsScan: a reward issued while the booker's
// periodic scan of every database is slow is booked without waiting for the
// scan's end. The scan reads each of the cell's databases in turn, one
// transaction each: on a busy server, a cell owning every shard took seconds
// over it, and a reward issued meanwhile waited for all of it (make test
// failed TestRewards once, still pending after 5 s). Here the reward tables
// of databases 0-49 are locked (LOCK TABLES ... WRITE), so the scan waits a
// transaction's 5 s timeout on each of them; the reward, in a database above
// 49, is booked as soon as the one the scan waits on times out, not after
// the 50 (over 4 minutes).
func TestBookerBooksAnIssueDuringItsScan(t *testing.T) {
	ns := privateDatabases(t) // empty reward tables to lock, and no one else's
	pre := strings.ReplaceAll(testenv.Prefix(), "_", "-")
	// Passes every 100 ms: the first scan (at the first pass) is over by the
	// time the tables are locked, and the next comes bookerScanEvery after it.
	c, _ := rewardCell(t, pre, false, func(cfg *cell.Config) { cfg.BookingInterval = 100 * time.Millisecond })
	act := actIn(t, pre+"_late", mustRanges(t, "500-999"))
	reward := func(rain string) {
		t.Helper()
		req := api.RewardRequest{ParentActivityID: pre + "-fest", SceneID: pre + "-rain", RainID: rain, ActID: act, AwardType: "cash", Amount: 100}
		if _, st, code := issue(t, c, req); st != 200 {
			t.Fatalf("issue %s: %d %s", rain, st, code)
		}
	}
	// One reward booked as usual makes the reward table to copy.
	reward("r0")
	waitFor(t, 60*time.Second, func() bool { return walletOf(t, c, act, "").Pending == 0 }, "the first reward booked")
	like := fmt.Sprintf("%sdb_%02d.t_reward", ns, sharding.ShardOfAct(act).DB())
	var locked []string
	for db := range 50 {
		exec(t, c.db, fmt.Sprintf("CREATE DATABASE IF NOT EXISTS %sdb_%02d", ns, db))
		table := fmt.Sprintf("%sdb_%02d.t_reward", ns, db)
		exec(t, c.db, "CREATE TABLE IF NOT EXISTS "+table+" LIKE "+like)
		locked = append(locked, table+" WRITE")
	}
	conn, err := c.db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), "LOCK TABLES "+strings.Join(locked, ", ")); err != nil {
		t.Fatal(err)
	}
	defer conn.ExecContext(context.Background(), "UNLOCK TABLES")
	waitFor(t, 30*time.Second, func() bool {
		var n int
		c.db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE LIKE 'Waiting for table metadata lock' AND INFO LIKE ?",
			"%"+ns+"db\\_%.t\\_reward%").Scan(&n)
		return n > 0
	}, "the booker's scan waiting on a locked reward table")
	start := time.Now()
	reward("r1")
	waitFor(t, 60*time.Second, func() bool { return walletOf(t, c, act, "").Pending == 0 }, "the reward issued during the scan booked")
	if w := walletOf(t, c, act, ""); w.Balance != 200 {
		t.Fatalf("wallet: %+v, want 200 booked", w)
	}
	t.Logf("booked %s after the issue, while the scan waited on locked tables", time.Since(start).Round(100*time.Millisecond))
}

func mustRanges(t *testing.T, s string) sharding.Ranges {
	t.Helper()
	r, err := sharding.ParseRanges(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
