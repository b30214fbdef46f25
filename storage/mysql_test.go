package storage

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"redcell/internal/clock"
	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

func openStore(t *testing.T) *MySQL {
	t.Helper()
	m, err := Open(testenv.MySQLDSN(t, 1), 32)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	return m
}

// setTime is a clock whose time the test sets (Set) while its waits pass in
// real time: the store's retry waits (a re-read after a lost COMMIT, the
// ledger's new snapshot) must still end while a test holds the time still.
type setTime struct {
	clock.Real
	at *clock.Manual
}

func newSetTime(t time.Time) setTime { return setTime{at: clock.NewManual(t)} }

func (c setTime) Now() time.Time  { return c.at.Now() }
func (c setTime) Set(t time.Time) { c.at.Set(t) }

func deposit(t *testing.T, m *MySQL, act string, amount model.Cents) {
	t.Helper()
	if _, err := Deposit(context.Background(), m, sharding.ShardOfAct(act), act, "dep-"+act, amount); err != nil {
		t.Fatal(err)
	}
}

func balance(t *testing.T, m *MySQL, act string) model.Cents {
	t.Helper()
	a, err := Account(context.Background(), m, sharding.ShardOfAct(act), act)
	if err != nil {
		t.Fatal(err)
	}
	return a.Balance
}

func send(t *testing.T, m *MySQL, sender string, amount model.Cents, count int64, expires time.Duration) model.PacketRef {
	t.Helper()
	s := sharding.ShardOfAct(sender)
	id := model.NewPacketID(s, m.clock.Now())
	p, _, err := Send(context.Background(), m, s, model.SendRequest{Sender: sender, Amount: amount, Count: count, Kind: model.KindRandom, OrderNo: "snd-" + string(id[11:])}, id, m.clock.Now().Add(expires).UnixMilli())
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := model.ParsePacketID(string(p.ID))
	return ref
}

// rowsOfPacket reads the packet's claims back from the database.
func rowsOfPacket(t *testing.T, m *MySQL, ref model.PacketRef) (sum model.Cents, n int64, users map[string]int) {
	t.Helper()
	rows, err := m.db.Query("SELECT act_id, amount FROM "+m.claimTable(ref.Shard, ref.Day)+" WHERE packet_id = ?", string(ref.ID))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	users = map[string]int{}
	for rows.Next() {
		var act string
		var a model.Cents
		if err := rows.Scan(&act, &a); err != nil {
			t.Fatal(err)
		}
		if a < 1 {
			t.Fatalf("claim of %d cents", a)
		}
		sum += a
		n++
		users[act]++
	}
	return sum, n, users
}

func TestDepositIdempotentByOrderNo(t *testing.T) {
	m := openStore(t)
	ctx := context.Background()
	act := testenv.Prefix() + "-a"
	s := sharding.ShardOfAct(act)
	d, err := Deposit(ctx, m, s, act, "o1", 100)
	if err != nil || d.Balance != 100 || d.Repeat {
		t.Fatalf("%+v %v", d, err)
	}
	d, err = Deposit(ctx, m, s, act, "o1", 100)
	if err != nil || d.Balance != 100 || !d.Repeat {
		t.Fatalf("retry: %+v %v", d, err)
	}
	if _, err = Deposit(ctx, m, s, act, "o1", 200); !errors.Is(err, model.ErrOrderConflict) {
		t.Fatalf("same order_no, other amount: %v", err)
	}
	if d, err = Deposit(ctx, m, s, act, "o2", 50); err != nil || d.Balance != 150 {
		t.Fatalf("%+v %v", d, err)
	}
	// 20 concurrent retries of one new order apply it once.
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := Deposit(ctx, m, s, act, "o3", 7); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if b := balance(t, m, act); b != 157 {
		t.Fatalf("balance %d, want 157", b)
	}
	var flows int
	m.db.QueryRow("SELECT COUNT(*) FROM "+m.flowTable(s)+" WHERE act_id = ?", act).Scan(&flows)
	if flows != 3 {
		t.Fatalf("%d flow rows, want 3", flows)
	}
}

func TestSendDebitsOnceAndInsufficientChangesNothing(t *testing.T) {
	m := openStore(t)
	ctx := context.Background()
	sender := testenv.Prefix() + "-s"
	s := sharding.ShardOfAct(sender)
	deposit(t, m, sender, 500)
	req := model.SendRequest{Sender: sender, Amount: 1000, Count: 10, Kind: model.KindRandom, OrderNo: "snd-1"}
	if _, _, err := Send(ctx, m, s, req, model.NewPacketID(s, time.Now()), time.Now().Add(time.Hour).UnixMilli()); !errors.Is(err, model.ErrInsufficientBalance) {
		t.Fatalf("send above balance: %v", err)
	}
	if b := balance(t, m, sender); b != 500 {
		t.Fatalf("balance %d after a refused send", b)
	}
	req.Amount = 300
	id := model.NewPacketID(s, time.Now())
	p, rep, err := Send(ctx, m, s, req, id, time.Now().Add(time.Hour).UnixMilli())
	if err != nil || rep || p.ID != id || p.RemainingAmount != 300 {
		t.Fatalf("%+v %v %v", p, rep, err)
	}
	p2, rep, err := Send(ctx, m, s, req, model.NewPacketID(s, time.Now()), time.Now().Add(time.Hour).UnixMilli())
	if err != nil || !rep || p2.ID != id {
		t.Fatalf("retry made %s (repeat %v, err %v), want %s", p2.ID, rep, err, id)
	}
	req.Count = 3
	if _, _, err := Send(ctx, m, s, req, model.NewPacketID(s, time.Now()), time.Now().Add(time.Hour).UnixMilli()); !errors.Is(err, model.ErrOrderConflict) {
		t.Fatalf("same order_no, other body: %v", err)
	}
	if b := balance(t, m, sender); b != 200 {
		t.Fatalf("balance %d, want 200", b)
	}
}

func TestOpenBatchInvariants(t *testing.T) {
	m := openStore(t)
	ctx := context.Background()
	pre := testenv.Prefix()
	sender := pre + "-s"
	deposit(t, m, sender, 1000)
	ref := send(t, m, sender, 1000, 10, time.Hour)
	var reqs []model.OpenRequest
	for i := 0; i < 15; i++ {
		act := pre + "-u" + string(rune('a'+i))
		reqs = append(reqs, model.OpenRequest{ActID: act, Shard: sharding.ShardOfAct(act)})
	}
	reqs = append(reqs, reqs[0]) // the same user twice in one batch
	r := rand.New(rand.NewPCG(1, 2))
	res, p, err := OpenBatch(ctx, m, ref, reqs[:6], r)
	if err != nil {
		t.Fatal(err)
	}
	if p.RemainingCount != 4 {
		t.Fatalf("remaining count %d after 6 opens", p.RemainingCount)
	}
	res2, p, err := OpenBatch(ctx, m, ref, reqs, r) // 6 repeats, 4 new, 5 sold out, 1 duplicate
	if err != nil {
		t.Fatal(err)
	}
	var repeats, soldOut int
	for i, x := range res2 {
		switch {
		case x.Err == nil && x.Repeat:
			repeats++
		case errors.Is(x.Err, model.ErrSoldOut):
			soldOut++
		case x.Err != nil:
			t.Fatalf("open %d: %v", i, x.Err)
		}
		if i < 6 && (x.Claim.ID != res[i].Claim.ID || x.Claim.Amount != res[i].Claim.Amount) {
			t.Fatalf("repeat open %d returned another claim", i)
		}
	}
	if repeats != 7 || soldOut != 5 || res2[15].Claim.ID != res2[0].Claim.ID {
		t.Fatalf("repeats %d sold out %d", repeats, soldOut)
	}
	if p.Status != model.StatusSoldOut || p.RemainingAmount != 0 || p.RemainingCount != 0 {
		t.Fatalf("packet after sell-out %+v", p)
	}
	sum, n, users := rowsOfPacket(t, m, ref)
	if sum != 1000 || n != 10 || len(users) != 10 {
		t.Fatalf("rows: sum %d, %d claims, %d users", sum, n, len(users))
	}
	// Opening an unknown packet is NOT_FOUND, not an error of the batch.
	unknown, _ := model.ParsePacketID(string(model.NewPacketID(ref.Shard, time.Now())))
	res3, _, err := OpenBatch(ctx, m, unknown, reqs[:1], r)
	if err != nil || !errors.Is(res3[0].Err, model.ErrNotFound) {
		t.Fatalf("unknown packet: %v %v", err, res3[0].Err)
	}
}

// TestRefundRacesLateOpens opens a packet from many goroutines while its expiry
// passes and the refund runs: claims + refund = amount, and the refund is applied once.
func TestRefundRacesLateOpens(t *testing.T) {
	m := openStore(t)
	ctx := context.Background()
	for round := 0; round < 3; round++ {
		pre := testenv.Prefix()
		sender := pre + "-s"
		deposit(t, m, sender, 100000)
		ref := send(t, m, sender, 100000, 500, 150*time.Millisecond)
		var wg sync.WaitGroup
		var mu sync.Mutex
		claimed := model.Cents(0)
		for g := 0; g < 16; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(g), uint64(round)))
				for i := 0; i < 40; i++ {
					act := pre + "-u" + itoa(g*1000+i)
					res, _, err := OpenBatch(ctx, m, ref, []model.OpenRequest{{ActID: act, Shard: sharding.ShardOfAct(act)}}, r)
					if err != nil {
						t.Error(err)
						return
					}
					if res[0].Err == nil {
						mu.Lock()
						claimed += res[0].Claim.Amount
						mu.Unlock()
					} else if !errors.Is(res[0].Err, model.ErrExpired) && !errors.Is(res[0].Err, model.ErrSoldOut) {
						t.Error(res[0].Err)
					}
					time.Sleep(time.Duration(r.IntN(8)) * time.Millisecond)
				}
			}()
		}
		sent, err := Packet(ctx, m, ref)
		if err != nil {
			t.Fatal(err)
		}
		var refunded model.Cents
		for i := 0; i < 4; i++ { // several refunders race too
			wg.Add(1)
			go func() {
				defer wg.Done()
				// From the moment the packet expires at the store's clock.
				if !testenv.Until(10*time.Second, func() bool { return m.clock.Now().UnixMilli() >= sent.ExpiresMS }) {
					t.Error("the packet did not expire 10 s after it was sent with 150 ms")
					return
				}
				for j := 0; j < 20; j++ {
					c, err := Refund(ctx, m, ref)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					refunded += c
					mu.Unlock()
					time.Sleep(5 * time.Millisecond)
				}
			}()
		}
		wg.Wait()
		sum, _, _ := rowsOfPacket(t, m, ref)
		p, err := Packet(ctx, m, ref)
		if err != nil {
			t.Fatal(err)
		}
		if sum != claimed || sum+p.RefundAmount != 100000 || p.RefundAmount != refunded || p.RemainingAmount != 0 {
			t.Fatalf("claims %d (answered %d) + refund %d (answered %d) != 100000; packet %+v", sum, claimed, p.RefundAmount, refunded, p)
		}
		var refundFlows int
		var refundSum model.Cents
		m.db.QueryRow("SELECT COUNT(*), COALESCE(SUM(amount),0) FROM "+m.flowTable(ref.Shard)+" WHERE act_id = ? AND kind = 'refund'", sender).Scan(&refundFlows, &refundSum)
		if refunded > 0 && (refundFlows != 1 || refundSum != refunded) {
			t.Fatalf("%d refund flows of %d cents, want 1 of %d", refundFlows, refundSum, refunded)
		}
		if b := balance(t, m, sender); b != refunded {
			t.Fatalf("sender balance %d, want the refund %d", b, refunded)
		}
	}
}

func itoa(i int) string {
	return string(rune('a'+i%26)) + string(rune('a'+(i/26)%26)) + string(rune('a'+(i/676)%26))
}

func TestApplyCreditsExactlyOnce(t *testing.T) {
	m := openStore(t)
	ctx := context.Background()
	pre := testenv.Prefix()
	sender := pre + "-s"
	deposit(t, m, sender, 300)
	ref := send(t, m, sender, 300, 3, time.Hour)
	var credits []model.Credit
	for _, u := range []string{"a", "b", "c"} {
		act := pre + "-" + u
		res, _, err := OpenBatch(ctx, m, ref, []model.OpenRequest{{ActID: act, Shard: sharding.ShardOfAct(act)}}, rand.New(rand.NewPCG(1, 1)))
		if err != nil || res[0].Err != nil {
			t.Fatal(err, res[0].Err)
		}
		c := res[0].Claim
		credits = append(credits, model.Credit{ClaimID: c.ID, PacketID: c.PacketID, ActID: c.ActID, Shard: sharding.ShardOfAct(c.ActID), Amount: c.Amount, CreatedMS: c.CreatedMS})
	}
	pending, _, err := ClaimsAfter(ctx, m, ref.Shard.DB(), 0, model.ClaimPos{}, time.Now().UnixMilli(), 100_000)
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, p := range pending {
		for _, c := range credits {
			if p.ClaimID == c.ClaimID && p.ActID == c.ActID && p.Amount == c.Amount && p.Shard == c.Shard && p.CreatedMS == c.CreatedMS {
				found++
			}
		}
	}
	if found != 3 {
		t.Fatalf("the claims read back hold %d of the 3 credits owed", found)
	}
	for i := 0; i < 3; i++ { // deliver three times
		n, deferred, err := ApplyCredits(ctx, m, credits)
		if err != nil || len(deferred) != 0 {
			t.Fatal(deferred, err)
		}
		if want := map[bool]int{true: 3, false: 0}[i == 0]; n != want {
			t.Fatalf("delivery %d applied %d, want %d", i, n, want)
		}
	}
	for _, c := range credits {
		if b := balance(t, m, c.ActID); b != c.Amount {
			t.Fatalf("%s balance %d, claim %d", c.ActID, b, c.Amount)
		}
	}
}

// TestLedgerBalances reads every row on both test servers (other packages'
// tests move money between them): whatever the tests did, the books must
// balance and no row-level invariant may be broken.
func TestLedgerBalances(t *testing.T) {
	m := openStore(t)
	m2, err := Open(testenv.MySQLDSN(t, 2), 4)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	l, err := m.Ledger(context.Background(), "db1")
	if err != nil {
		t.Fatal(err)
	}
	l2, err := m2.Ledger(context.Background(), "db2")
	if err != nil {
		t.Fatal(err)
	}
	rep := model.Audit([]model.Ledger{l, l2})
	if !rep.OK() {
		t.Fatalf("audit of the test database: %+v", rep)
	}
	if rep.Deposits == 0 || rep.Packets == 0 {
		t.Fatalf("audit read nothing: %+v", rep)
	}
	// The audit summed in the server agrees with the ledger read into memory.
	all := func(model.ShardID) bool { return true }
	a, err := m.CellAudit(context.Background(), "db1", all)
	if want := model.AuditCell(l, all); err != nil || !reflect.DeepEqual(a, want) {
		t.Fatalf("cell audit of the test database: %+v, %v; of its ledger: %+v", a, err, want)
	}
}

// TestConcurrentSendRetries: a send whose amount is the whole balance, retried
// 20 times at once with the same order number: one packet, one debit, and every
// retry answers with that packet (never INSUFFICIENT_BALANCE).
func TestConcurrentSendRetries(t *testing.T) {
	m := openStore(t)
	ctx := context.Background()
	sender := testenv.Prefix() + "-s"
	s := sharding.ShardOfAct(sender)
	deposit(t, m, sender, 100)
	req := model.SendRequest{Sender: sender, Amount: 100, Count: 2, Kind: model.KindRandom, OrderNo: "snd-all"}
	ids := make([]model.PacketID, 20)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, _, err := Send(ctx, m, s, req, model.NewPacketID(s, time.Now()), time.Now().Add(time.Hour).UnixMilli())
			if err != nil {
				t.Errorf("retry %d: %v", i, err)
				return
			}
			ids[i] = p.ID
		}()
	}
	wg.Wait()
	for i := range ids {
		if ids[i] != ids[0] || ids[i] == "" {
			t.Fatalf("retries answered different packets: %v", ids)
		}
	}
	if b := balance(t, m, sender); b != 0 {
		t.Fatalf("balance %d, want 0", b)
	}
}

// TestDSNParamsForced: the driver settings the money paths rely on hold even
// when the DSN asks otherwise.
func TestDSNParamsForced(t *testing.T) {
	full, err := withParams("root@tcp(127.0.0.1:3306)/?clientFoundRows=true&interpolateParams=false")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(full, "clientFoundRows=true") || !strings.Contains(full, "interpolateParams=true") {
		t.Fatalf("DSN %s", full)
	}
	if _, err := withParams("not a dsn"); err == nil {
		t.Fatal("bad DSN accepted")
	}
}

// TestShadowIsolation: stress traffic written through Shadow() lands in the
// shadow databases only; the real ledger never sees it.
func TestShadowIsolation(t *testing.T) {
	m := openStore(t)
	sh := m.Shadow()
	ctx := context.Background()
	act := testenv.Prefix() + "-x"
	s := sharding.ShardOfAct(act)
	before, err := m.Ledger(ctx, "real")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Deposit(ctx, sh, s, act, "dep-1", 777); err != nil {
		t.Fatal(err)
	}
	if b := balance(t, sh, act); b != 777 {
		t.Fatalf("shadow balance %d", b)
	}
	if b := balance(t, m, act); b != 0 {
		t.Fatalf("real balance %d after a shadow deposit", b)
	}
	var n int
	m.db.QueryRow("SELECT COUNT(*) FROM shadow_db_"+fmt.Sprintf("%02d", s.DB())+fmt.Sprintf(".t_account_%d", s.Table())+" WHERE act_id = ?", act).Scan(&n)
	if n != 1 {
		t.Fatalf("%d rows in the shadow table", n)
	}
	l, err := sh.Ledger(ctx, "shadow")
	if err != nil {
		t.Fatal(err)
	}
	if l.Deposits < 777 {
		t.Fatalf("shadow ledger deposits %d", l.Deposits)
	}
	after, err := m.Ledger(ctx, "real")
	if err != nil {
		t.Fatal(err)
	}
	if after.Deposits != before.Deposits || after.Balances != before.Balances {
		t.Fatalf("real ledger moved with a shadow deposit: deposits %d -> %d", before.Deposits, after.Deposits)
	}
}

func TestExpiredInFindsOnlyExpiredOpenPackets(t *testing.T) {
	m := openStore(t)
	ctx := context.Background()
	pre := testenv.Prefix()
	var refs []model.PacketRef
	for i := 0; i < 3; i++ {
		sender := fmt.Sprintf("%s-s%d", pre, i)
		deposit(t, m, sender, 150)
		refs = append(refs, send(t, m, sender, 100, 2, time.Hour))
	}
	later := send(t, m, pre+"-s0", 50, 1, 3*time.Hour) // same shard, expires later
	shards := []model.ShardID{}
	for _, r := range append(refs, later) {
		shards = append(shards, r.Shard)
	}
	days := []int{refs[0].Day}
	// The scan is asked at explicit times, so the test does not race the clock.
	find := func(at time.Time) map[model.PacketID]bool {
		ids, err := ExpiredIn(ctx, m, shards, days, at.UnixMilli(), 100000)
		if err != nil {
			t.Fatal(err)
		}
		got := map[model.PacketID]bool{}
		for _, id := range ids {
			got[id] = true
		}
		return got
	}
	if got := find(time.Now()); got[refs[0].ID] || got[later.ID] {
		t.Fatal("a packet listed before it expired")
	}
	inTwoHours := time.Now().Add(2 * time.Hour)
	got := find(inTwoHours)
	for _, r := range refs {
		if !got[r.ID] {
			t.Fatalf("expired packet %s not listed", r.ID)
		}
	}
	if got[later.ID] {
		t.Fatal("an unexpired packet listed")
	}
	m.SetClock(newSetTime(inTwoHours)) // Refund checks expiry by the store's clock
	for _, r := range refs {
		if c, err := Refund(ctx, m, r); err != nil || c != 100 {
			t.Fatalf("refund of %s: %d, %v", r.ID, c, err)
		}
	}
	if got := find(inTwoHours); got[refs[0].ID] {
		t.Fatal("a refunded packet listed again")
	}
}
