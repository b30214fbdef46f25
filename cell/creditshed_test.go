package cell_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"redcell/api"
	"redcell/cell"
	"redcell/internal/testenv"
	"redcell/model"
)

// TestOpensShedWhileCreditsLag: the relay's delivery of a credit hangs (its
// claimant's account table is locked by another session); while it does,
// opens are shed with OVERLOADED (reason credit_lag) once the credit has
// waited past the shedding bound, and taken again once the credit is
// booked. Every open answered 200 is credited once.
func TestOpensShedWhileCreditsLag(t *testing.T) {
	privateDatabases(t)
	c := oneCell(t, func(cfg *cell.Config) {
		cfg.AdminListen, cfg.AdminToken = freeAddr(t), adminToken
		def := cell.DefaultConfig()
		cfg.CreditShedFrom, cfg.CreditShedAll = def.CreditShedFrom, def.CreditShedAll // the harness turns it off
	})
	pre := testenv.Prefix()
	const heldShard = model.ShardID(331) // db_33: commit lane 1 of the default 2, the packet's db_00 lane 0
	held := actsInShard(t, pre+"-h", heldShard, 1)[0]
	sender := actsInShard(t, pre+"-s", 5, 1)[0] // its packets live in db_00, not the held claimant's db_33
	c.balance(t, held)                          // the held shard's tables exist (and the cell knows it)
	c.deposit(t, sender, 100_000)
	id := c.send(t, sender, 50_000, 500, "snd-1")

	ctx := context.Background()
	conn, err := c.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	account := fmt.Sprintf("%sdb_%02d.t_account_%d", c.ns, heldShard.DB(), heldShard.Table())
	if _, err := conn.ExecContext(ctx, "LOCK TABLES "+account+" WRITE"); err != nil {
		t.Fatal(err)
	}
	var unlockOnce sync.Once
	unlock := func() {
		unlockOnce.Do(func() {
			if _, err := conn.ExecContext(ctx, "UNLOCK TABLES"); err != nil {
				t.Error(err)
			}
			conn.Close()
		})
	}
	t.Cleanup(unlock)

	open := func(act string) (int, string, api.OpenResponse) {
		var out api.OpenResponse
		st, code := call(t, "POST", c.url+"/v1/packets/"+id+"/open", api.ActRequest{ActID: act}, &out)
		return st, code, out
	}
	// The credit's lag counts from its claim's creation, which is after
	// this: a shed measured from here comes no earlier than the lag's.
	before := time.Now()
	st, code, heldClaim := open(held)
	if st != http.StatusOK {
		t.Fatalf("the held claimant's open: %d %s", st, code)
	}
	// Its credit hangs in the relay; new opens go on until the credit has
	// waited past CreditShedFrom, and all are shed from CreditShedAll (1 s).
	// The delivery's own bound is 5 s: shedding must show before it.
	taken := 0
	shedAt := time.Time{}
	start := time.Now()
	for i := 0; time.Since(start) < 4*time.Second; i++ {
		act := fmt.Sprintf("%s-o%d", pre, i)
		st, code, _ := open(act)
		if st == http.StatusOK {
			taken++
			continue
		}
		if st != http.StatusServiceUnavailable || code != "OVERLOADED" {
			t.Fatalf("open %d (%s) after %s while a credit hangs: %d %s, want 200 or 503 OVERLOADED", i, act, time.Since(start), st, code)
		}
		shedAt = time.Now()
		break
	}
	if shedAt.IsZero() {
		t.Fatalf("no open shed within 4 s of a credit hanging (%d taken)", taken)
	}
	if d := shedAt.Sub(before); d < 350*time.Millisecond {
		t.Errorf("the first open shed %s after the credit began to hang, want after CreditShedFrom (400 ms)", d)
	}
	if n := metric(t, c, `redcell_cell_shed_total{reason="credit_lag"}`); n < 1 {
		t.Errorf(`redcell_cell_shed_total{reason="credit_lag"} = %v, want >= 1`, n)
	}

	unlock()
	var after api.OpenResponse
	tries := 0
	waitFor(t, 10*time.Second, func() bool {
		tries++
		st, _, out := open(fmt.Sprintf("%s-a%d", pre, tries))
		after = out
		return st == http.StatusOK
	}, "an open taken again after the credit was booked")
	waitFor(t, 10*time.Second, func() bool {
		return c.balance(t, held) == int64(heldClaim.Amount) && c.balance(t, after.ActID) == int64(after.Amount)
	}, "the held claimant and a later one credited")
	if b := c.balance(t, held); b != int64(heldClaim.Amount) {
		t.Errorf("the held claimant's balance %d, want its share once (%d)", b, heldClaim.Amount)
	}
}
