package storage

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"redcell/internal/clock"
	"redcell/internal/testenv"
	"redcell/model"
)

// bigCell fills a fresh namespace of test server 1 with a consistent cell of
// n claims (n a multiple of 100), written by the server itself (INSERT ...
// SELECT from a sequence): n/100 sold-out packets of 100 claims in shards
// 0-9, day 14; claimants u0..u99999 in shards 10-19 (as the claim rows'
// act_shard say), every claim credited; senders' deposits equal to their sends. One claim per
// millisecond from base. Returns the store.
func bigCell(t *testing.T, n int) (*MySQL, time.Time) {
	t.Helper()
	if n%100 != 0 {
		t.Fatalf("claims %d: not a multiple of 100", n)
	}
	base := time.Date(2026, 3, 14, 10, 0, 0, 0, time.UTC)
	m, err := Open(testenv.MySQLDSN(t, 1), 8)
	if err != nil {
		t.Fatal(err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	m.ns = "au" + hex.EncodeToString(b[:]) + "_"
	m.SetClock(newSetTime(base))
	t.Cleanup(func() { m.Close() })
	if os.Getenv("REDCELL_AUDIT_KEEP") == "" {
		t.Cleanup(func() { dropNamespace(t, m) })
	} else {
		t.Logf("keeping the cell's databases %s*", m.ns)
	}
	ctx := context.Background()
	var packetShards []model.ShardID
	for s := range model.ShardID(20) {
		if err := m.EnsureShard(ctx, s); err != nil {
			t.Fatal(err)
		}
		if s < 10 {
			packetShards = append(packetShards, s)
		}
	}
	if err := m.EnsureDays(ctx, packetShards, []int{14}, 2, nil); err != nil {
		t.Fatal(err)
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := m.db.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%.300s: %v", q, err)
		}
	}
	start := time.Now()
	ms := base.UnixMilli()
	// Claim i: packet i/100 (in shard (i/100)%10), seq i%100+1, claimant
	// u(i%100000) in shard 10+(i%100000)%10, 1 to 3 cents.
	for _, ps := range packetShards {
		exec(fmt.Sprintf("INSERT INTO %s (packet_id, seq, act_id, amount, created_ms, act_shard) "+
			"SELECT CONCAT('20260314', LPAD(%d, 3, '0'), LPAD(LOWER(HEX(seq DIV 100)), 16, '0')), seq %% 100 + 1, "+
			"CONCAT('u', seq %% 100000), 1 + seq %% 3, %d + seq, 10 + (seq %% 100000) %% 10 FROM %s.seq_0_to_%d WHERE (seq DIV 100) %% 10 = %d",
			m.claimTable(ps, 14), ps, ms, m.dbName(0), n-1, ps))
		exec(fmt.Sprintf("INSERT INTO %s (packet_id, sender, order_no, kind, greeting, amount, count, remaining_amount, remaining_count, "+
			"refund_amount, status, created_ms, expires_ms) SELECT packet_id, 'snd%d', CONCAT('s', packet_id), 'random', '', SUM(amount), 100, 0, 0, 0, 1, "+
			"MIN(created_ms) - 1, MIN(created_ms) + 86400000 FROM %s GROUP BY packet_id", m.packetTable(ps, 14), ps, m.claimTable(ps, 14)))
		exec(fmt.Sprintf("INSERT INTO %s (act_id, order_no, kind, amount, created_ms) SELECT sender, CONCAT('snd-', packet_id), 'send', -amount, created_ms FROM %s",
			m.flowTable(ps), m.packetTable(ps, 14)))
		exec(fmt.Sprintf("INSERT INTO %s (act_id, order_no, kind, amount, created_ms) SELECT 'snd%d', 'dep', 'deposit', COALESCE(-SUM(amount), 0), %d FROM %s",
			m.flowTable(ps), ps, ms, m.flowTable(ps)))
		exec(fmt.Sprintf("INSERT INTO %s (act_id, balance, updated_ms) VALUES ('snd%d', 0, %d)", m.accountTable(ps), ps, ms))
	}
	for cs := model.ShardID(10); cs < 20; cs++ {
		for _, ps := range packetShards {
			exec(fmt.Sprintf("INSERT INTO %s (act_id, order_no, kind, amount, created_ms) SELECT act_id, CONCAT('claim:', packet_id, 'c', seq), 'credit', amount, created_ms "+
				"FROM %s WHERE act_shard = %d", m.flowTable(cs), m.claimTable(ps, 14), cs))
		}
		exec(fmt.Sprintf("INSERT INTO %s (act_id, balance, updated_ms) SELECT act_id, SUM(amount), %d FROM %s GROUP BY act_id",
			m.accountTable(cs), ms, m.flowTable(cs)))
	}
	t.Logf("filled %d claims in %s", n, time.Since(start).Round(time.Millisecond))
	return m, base
}

// peakHeap runs fn and returns the highest heap in use (bytes) seen while it
// ran, above the heap in use before it started, sampled every 2 ms.
func peakHeap(fn func()) uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.HeapInuse
	var peak atomic.Uint64
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		var s runtime.MemStats
		clock.Every(ctx, clock.Real{}, 2*time.Millisecond, func(int) {
			runtime.ReadMemStats(&s)
			if s.HeapInuse > peak.Load() {
				peak.Store(s.HeapInuse)
			}
		})
	})
	fn()
	stop()
	wg.Wait()
	runtime.ReadMemStats(&ms)
	p := max(peak.Load(), ms.HeapInuse)
	if p < before {
		return 0
	}
	return p - before
}

// vmHWM is the process's peak resident memory so far (VmHWM of
// /proc/self/status), as written there, or "?".
func vmHWM() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return "?"
}

// TestCellAuditMemory audits a cell of 20,000 claims (REDCELL_AUDIT_CLAIMS
// for another size, e.g. 1000000: not in make test) both ways: the Ledger read
// into memory and checked with model.AuditCell, and CellAudit summed and
// joined in the server. Both must be clean and equal; it logs each one's time
// and peak Go heap. The heap CellAudit needs must not grow with the claims:
// at most 16 MiB above the heap before it, whatever the size.
func TestCellAuditMemory(t *testing.T) {
	n := 20_000
	if v := os.Getenv("REDCELL_AUDIT_CLAIMS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			t.Fatalf("REDCELL_AUDIT_CLAIMS=%q: %v", v, err)
		}
	}
	m, _ := bigCell(t, n)
	ctx := context.Background()
	owns := func(s model.ShardID) bool { return s < 20 }
	var inSQL, inMemory model.CellAudit
	var err error
	start := time.Now()
	sqlPeak := peakHeap(func() { inSQL, err = m.CellAudit(ctx, "big", owns) })
	sqlTook := time.Since(start)
	sqlHWM := vmHWM()
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	memPeak := peakHeap(func() {
		var l model.Ledger
		if l, err = m.Ledger(ctx, "big"); err == nil {
			inMemory = model.AuditCell(l, owns)
		}
	})
	memTook := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if !inSQL.OK() || inSQL.Claims != n || !reflect.DeepEqual(inSQL, inMemory) {
		t.Fatalf("cell audit of %d claims:\nin the server %+v\nin memory %+v", n, inSQL, inMemory)
	}
	t.Logf("cell audit of %d claims: CellAudit %s, peak heap +%.1f MiB (VmHWM after it %s); Ledger+AuditCell %s, peak heap +%.1f MiB (VmHWM after it %s)",
		n, sqlTook.Round(time.Millisecond), float64(sqlPeak)/(1<<20), sqlHWM, memTook.Round(time.Millisecond), float64(memPeak)/(1<<20), vmHWM())
	if sqlPeak > 16<<20 {
		t.Fatalf("CellAudit of %d claims took %.1f MiB of heap", n, float64(sqlPeak)/(1<<20))
	}
}

// TestReconRate reads a cell's claims as reconciliation does (cell/recon: a
// window of at most 20,000 claims at a time, their credits looked up 5,000
// at a time) from the first claim to the last, checks every claim is found
// credited, and logs the rate.
// 20,000 claims; REDCELL_RECON_CLAIMS for another size.
func TestReconRate(t *testing.T) {
	n := 20_000
	if v := os.Getenv("REDCELL_RECON_CLAIMS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			t.Fatalf("REDCELL_RECON_CLAIMS=%q: %v", v, err)
		}
	}
	m, base := bigCell(t, n)
	ctx := context.Background()
	var shards []model.ShardID
	for s := range model.ShardID(10) {
		shards = append(shards, s)
	}
	from, to := base.UnixMilli(), base.UnixMilli()+int64(n)
	var checked, credited model.Tally
	windows := 0
	var inCredits time.Duration
	start := time.Now()
	for from < to {
		w, err := ReconWindow(ctx, m, 0, shards, []int{14}, from, to, 20_000)
		if err != nil {
			t.Fatal(err)
		}
		windows++
		owed := make([]model.Credit, 0, len(w.Claims))
		for _, c := range w.Claims {
			checked.Add(c.Amount)
			owed = append(owed, model.CreditOf(c))
		}
		for i := 0; i < len(owed); i += 5000 {
			chunk := owed[i:min(i+5000, len(owed))]
			began := time.Now()
			found, err := CreditsOf(ctx, m, chunk)
			inCredits += time.Since(began)
			if err != nil {
				t.Fatal(err)
			}
			cc := model.CompareCredits(chunk, found)
			if cc.Diffs.Count() != 0 {
				t.Fatalf("credits: %v", cc.Diffs.Problems())
			}
			credited = credited.Plus(cc.Matched)
		}
		from = w.ToMS
	}
	took := time.Since(start)
	if checked.Count != int64(n) || credited != checked {
		t.Fatalf("checked %+v, credited %+v of %d claims", checked, credited, n)
	}
	t.Logf("reconciled %d claims in %d windows in %s (%s of it in CreditsOf): %.0f claims/s", n, windows, took.Round(time.Millisecond),
		inCredits.Round(time.Millisecond), float64(n)/took.Seconds())
}
