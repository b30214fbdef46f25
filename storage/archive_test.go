package storage

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"redcell/model"
	"redcell/sharding"
)

// TestArchiveSeventyDays runs a cell's packets over 70 days of a fake clock:
// every day three senders send two packets each (one claimed out, one with a
// remainder refunded the next day), and the archive pass moves settled
// packets older than a 7-day retention. Day slots come round twice. Each
// day, before the day's sends, its day tables hold nothing older than the
// retention (emptied before the slot is reused); the cell audit stays clean
// with every cent ever sent in it (archived money counted); archived packets
// still answer reads by ID, a repeat of their send order and a claimant's
// repeat open; and a packet left open past the retention stays where it is,
// counted unsettled, until its refund runs.
func TestArchiveSeventyDays(t *testing.T) {
	start := time.Date(2027, 1, 20, 0, 0, 0, 0, time.UTC) // crosses Feb (28 days) and two 31-day months
	clk := newSetTime(start)
	m, _, _ := ContractMySQL(t, clk)
	ctx := context.Background()
	owns := func(model.ShardID) bool { return true }
	const retention = 7 * 24 * time.Hour
	senders := []string{"ann", "bob", "cat"}
	for _, s := range senders {
		deposit(t, m, s, 10_000_000)
	}
	type sent struct {
		ref      model.PacketRef
		order    string
		amount   model.Cents
		claimant string // one who claimed it
		claims   int
		day      int
	}
	var all []sent
	var total, claimed model.Cents
	var stuck *sent // left open past the retention on purpose
	var archived, archivedClaims int
	var archivedCents model.Cents
	r := rand.New(rand.NewPCG(7, 70))
	for day := 0; day < 70; day++ {
		today := start.AddDate(0, 0, day)
		clk.Set(today.Add(9 * time.Hour))
		// The day slot about to be written holds nothing older than the
		// retention: last month's same day was archived.
		_, _, dd := today.Date()
		for _, s := range senders {
			sh := sharding.ShardOfAct(s)
			var old int
			err := m.db.QueryRow("SELECT COUNT(*) FROM "+m.packetTable(sh, dd)+" WHERE created_ms < ?", today.Add(-retention).UnixMilli()).Scan(&old)
			if err != nil && !isMySQLErr(err, errNoSuchTable) {
				t.Fatal(err)
			}
			if old > 0 && (stuck == nil || stuck.ref.Shard != sh || stuck.ref.Day != dd) {
				t.Fatalf("day %d (%s): %s holds %d packets older than the retention", day, today.Format("2006-01-02"), m.packetTable(sh, dd), old)
			}
		}
		for i, s := range senders {
			for k := 0; k < 2; k++ {
				amount := model.Cents(100 + r.IntN(900))
				count := int64(3)
				ref := send(t, m, s, amount, count, 24*time.Hour)
				opens := 1 // the second packet: one share, the rest refunded
				if k == 0 {
					opens = int(count) // the first: claimed out
				}
				p := sent{ref: ref, amount: amount, day: day, claims: opens}
				pk, err := Packet(ctx, m, ref)
				if err != nil {
					t.Fatal(err)
				}
				p.order = pk.OrderNo
				total += amount
				for u := 0; u < opens; u++ {
					act := fmt.Sprintf("u%d-%d-%d-%d", day, i, k, u)
					res, _, err := OpenBatch(ctx, m, ref, []model.OpenRequest{{ActID: act, Shard: sharding.ShardOfAct(act)}}, r)
					if err != nil || res[0].Err != nil {
						t.Fatalf("open: %v %v", err, res)
					}
					claimed += res[0].Claim.Amount
					p.claimant = act
				}
				all = append(all, p)
				if day == 3 && i == 0 && k == 1 {
					s := p
					stuck = &s
				}
			}
		}
		// The next morning: yesterday's packets expired; their remainders
		// are refunded, except the stuck one until day 20.
		clk.Set(today.Add(33 * time.Hour))
		for _, p := range all {
			if p.day != day || p.day == 3 && stuck != nil && p.ref == stuck.ref {
				continue
			}
			if _, err := Refund(ctx, m, p.ref); err != nil {
				t.Fatal(err)
			}
		}
		if day == 20 {
			if _, err := Refund(ctx, m, stuck.ref); err != nil {
				t.Fatal(err)
			}
		}
		res, err := Archive(ctx, m, owns, clk.Now().Add(-retention).UnixMilli())
		if err != nil {
			t.Fatal(err)
		}
		archived += res.Packets
		archivedClaims += res.Claims
		archivedCents += res.Cents
		wantStuck := 0
		if day >= 10 && day < 20 { // older than the retention from day 3 + 7, refunded on day 20
			wantStuck = 1
		}
		if res.Unsettled != wantStuck {
			t.Fatalf("day %d: %d unsettled, want %d", day, res.Unsettled, wantStuck)
		}
		// Every packet created before the cut is archived, the stuck one
		// once refunded; none younger.
		cut := clk.Now().Add(-retention)
		want, wantClaims, wantCents := 0, 0, model.Cents(0)
		for _, p := range all {
			created := start.AddDate(0, 0, p.day).Add(9 * time.Hour)
			if created.Before(cut) && (p.ref != stuck.ref || day >= 20) {
				want++
				wantClaims += p.claims
				wantCents += p.amount
			}
		}
		if archived != want || archivedClaims != wantClaims || archivedCents != wantCents {
			t.Fatalf("day %d: %d packets, %d claims, %d cents archived; want %d, %d, %d", day, archived, archivedClaims, archivedCents, want, wantClaims, wantCents)
		}
		if day%10 == 9 || day == 69 {
			a := sameCellAudit(t, m, owns)
			if a.Difference != 0 || len(a.Problems) != 0 || a.PacketTotals != total || a.Claimed != claimed || a.Packets != int64(len(all)) {
				t.Fatalf("day %d: audit %+v; want %d packets, %d sent, %d claimed, clean", day, a, len(all), total, claimed)
			}
		}
	}
	if archived < 300 {
		t.Fatalf("only %d packets archived in 70 days", archived)
	}
	// An archived packet answers reads by ID, its send order's repeat and
	// its claimant's repeat open.
	p := all[0]
	if n := countRows(t, m, m.packetTable(p.ref.Shard, p.ref.Day), string(p.ref.ID)); n != 0 {
		t.Fatalf("packet %s still in its day table", p.ref.ID)
	}
	pk, err := Packet(ctx, m, p.ref)
	if err != nil || pk.ID != p.ref.ID || pk.Amount != p.amount || pk.Status == model.StatusOpen {
		t.Fatalf("archived packet read as %+v, %v", pk, err)
	}
	cs, err := Claims(ctx, m, p.ref, 0, 10)
	if err != nil || len(cs) != 3 {
		t.Fatalf("archived packet's claims %+v, %v", cs, err)
	}
	held, err := ClaimsOf(ctx, m, p.ref, []model.OpenRequest{{ActID: p.claimant}, {ActID: "nobody"}})
	if err != nil || len(held) != 1 || held[p.claimant].PacketID != p.ref.ID {
		t.Fatalf("claims of %s on the archived packet: %+v, %v", p.claimant, held, err)
	}
	again, repeat, err := Send(ctx, m, p.ref.Shard, model.SendRequest{Sender: senders[0], Amount: p.amount, Count: 3, Kind: model.KindRandom, OrderNo: p.order},
		model.NewPacketID(p.ref.Shard, clk.Now()), clk.Now().Add(time.Hour).UnixMilli())
	if err != nil || !repeat || again.ID != p.ref.ID {
		t.Fatalf("repeat of the archived packet's send: %+v repeat=%v %v", again, repeat, err)
	}
	// Reconciliation of an old window reads the archived claims too, with
	// the credit each owes (its claimant's shard).
	var dbShards []model.ShardID
	for sh := model.ShardID(p.ref.Shard.DB() * 10); sh < model.ShardID(p.ref.Shard.DB()*10+10); sh++ {
		dbShards = append(dbShards, sh)
	}
	w, err := ReconWindow(ctx, m, p.ref.Shard.DB(), dbShards, []int{p.ref.Day}, start.UnixMilli(), start.Add(24*time.Hour).UnixMilli(), 1000)
	if err != nil {
		t.Fatal(err)
	}
	inWindow := 0
	for _, c := range w.Claims {
		if c.PacketID == p.ref.ID {
			inWindow++
			if c.ActShard != sharding.ShardOfAct(c.ActID) {
				t.Errorf("archived claim %s read with claimant shard %d, want %d", c.ID, c.ActShard, sharding.ShardOfAct(c.ActID))
			}
		}
	}
	if inWindow != 3 {
		t.Fatalf("the reconciliation window of day 0 holds %d of the archived packet's 3 claims: %+v", inWindow, w)
	}
	// A packet ID never sent is still not found.
	ghost := p.ref
	ghost.ID = model.NewPacketID(p.ref.Shard, start)
	if _, err := Packet(ctx, m, ghost); !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("a packet never sent: %v", err)
	}
	if cs, err := Claims(ctx, m, ghost, 0, 10); err != nil || len(cs) != 0 {
		t.Fatalf("claims of a packet never sent: %v, %v", cs, err)
	}
}

// countRows counts the rows of table whose packet_id is id.
func countRows(t *testing.T, m *MySQL, table, id string) int {
	t.Helper()
	var n int
	if err := m.db.QueryRow("SELECT COUNT(*) FROM "+table+" WHERE packet_id = ?", id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
