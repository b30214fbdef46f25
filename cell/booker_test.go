package cell_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"redcell/api"
	"redcell/cell"
	"redcell/internal/testenv"
)

// TestBookerWaitsForItsRateOutsideTheTransaction: a booker whose batch
// waits longer for booking_rate than a transaction's 5 s timeout still books
// it once the rate allows. booking_rate 2/s, batches of 12, 24 rewards
// issued with the booking off: switched on, the first batch spends the
// burst and the second waits 6 s for its tokens. Before, the take's timeout
// also covered that wait and the booking behind it: the batch failed ("begin:
// context deadline exceeded") and stayed processing for 30 s (bookerStale).
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
	for time.Since(start) < 20*time.Second {
		if w := walletOf(t, c, act, "official"); w.Pending == 0 && w.Balance == 24 {
			t.Logf("24 rewards booked %s after the booking was switched on", time.Since(start).Round(100*time.Millisecond))
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("20 s after the booking was switched on: %+v", walletOf(t, c, act, "official"))
}
