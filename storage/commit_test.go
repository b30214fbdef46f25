package storage

import (
	"bytes"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"redcell/internal/testenv"
	"redcell/model"
	"redcell/sharding"
)

// commitCutter is a TCP proxy in front of MariaDB that, once armed, cuts the
// next connection that sends a statement that commits: a COMMIT, or the
// INSERT of a reward or coupon request outside a transaction (autocommit:
// storeAlone). Each read from the client is taken to start at a packet
// (the driver writes a statement and waits for its answer). With forward set it
// passes the statement on and drops the server's answer (the commit happens,
// the client never hears of it); without, it drops the statement itself
// (nothing is committed: the server rolls back when the connection goes).
// The fault of a database restarting between a commit and its answer,
// injected on purpose.
type commitCutter struct {
	ln      net.Listener
	target  string
	forward atomic.Bool
	armed   atomic.Bool
	cuts    atomic.Int64
	wg      sync.WaitGroup
}

// arm makes the cutter cut the next COMMIT, passing it on to the server first
// when forward is set.
func (p *commitCutter) arm(forward bool) {
	p.forward.Store(forward)
	p.armed.Store(true)
}

func newCommitCutter(t testing.TB, target string) *commitCutter {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &commitCutter{ln: ln, target: target}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() { defer p.wg.Done(); p.pipe(c) }()
		}
	}()
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *commitCutter) pipe(client net.Conn) {
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	var cut atomic.Bool // set before the COMMIT goes on: its answer is dropped
	done := make(chan struct{})
	answered := make(chan struct{}) // closed when the server answered the cut COMMIT
	go func() {                     // server → client
		defer close(done)
		buf := make([]byte, 32<<10)
		for {
			n, err := server.Read(buf)
			if n > 0 && cut.Load() {
				close(answered) // the server committed: its answer goes nowhere
				return
			}
			if n > 0 {
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	inTx := false // a START TRANSACTION was sent, its COMMIT or ROLLBACK not yet
	for {
		n, err := client.Read(buf)
		if n > 0 {
			// COM_QUERY (0x03) after the 4-byte packet header: the text
			// protocol (interpolateParams) sends every statement so.
			commits := false
			if n > 5 && buf[4] == 0x03 {
				text := buf[5:n]
				switch {
				case bytes.HasPrefix(text, []byte("START TRANSACTION")):
					inTx = true
				case bytes.HasPrefix(text, []byte("COMMIT")):
					inTx, commits = false, true
				case bytes.HasPrefix(text, []byte("ROLLBACK")) && !bytes.HasPrefix(text, []byte("ROLLBACK TO")):
					inTx = false
				case !inTx && bytes.HasPrefix(text, []byte("INSERT")) &&
					(bytes.Contains(text[:min(len(text), 200)], []byte(".t_reward (")) || bytes.Contains(text[:min(len(text), 200)], []byte(".t_coupon_req ("))):
					// storeAlone's INSERT (a reward's or a coupon request's,
					// in autocommit); other autocommit statements pass.
					commits = true
				}
			}
			if commits && p.armed.CompareAndSwap(true, false) {
				cut.Store(true)
				if p.forward.Load() {
					_, _ = server.Write(buf[:n])
					select { // wait for the server's answer, bounded in case it never comes
					case <-answered:
					case <-done:
					case <-time.After(5 * time.Second):
					}
				}
				p.cuts.Add(1)
				break
			}
			if _, werr := server.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	client.Close()
	server.Close()
	<-done
}

// openCut opens a store whose connections go through a commitCutter.
func openCut(t *testing.T, forward bool) (*MySQL, *commitCutter) {
	t.Helper()
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN(t, 1))
	if err != nil {
		t.Fatal(err)
	}
	p := newCommitCutter(t, cfg.Addr)
	p.forward.Store(forward)
	cfg.Addr = p.ln.Addr().String()
	m, err := Open(cfg.FormatDSN(), 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, p
}

// TestCommitAnswerLost: a deposit and a send whose COMMIT reached the server
// but whose answer was lost are re-read by order number and answered as
// applied, once; rows and balances are exact.
func TestCommitAnswerLost(t *testing.T) {
	m, p := openCut(t, true)
	direct := openStore(t)
	ctx := context.Background()
	act := testenv.Prefix() + "-lost"
	s := sharding.ShardOfAct(act)
	if _, err := Account(ctx, m, s, act); err != nil { // the shard's tables exist before the cut
		t.Fatal(err)
	}

	p.arm(p.forward.Load())
	d, err := Deposit(ctx, m, s, act, "dep-1", 5000)
	if err != nil || d.Repeat || d.Balance != 5000 || p.cuts.Load() != 1 {
		t.Fatalf("deposit with its COMMIT answer lost: %+v, %v (cuts %d)", d, err, p.cuts.Load())
	}

	id := model.NewPacketID(s, time.Now())
	p.arm(p.forward.Load())
	pk, rep, err := Send(ctx, m, s, model.SendRequest{Sender: act, Amount: 1200, Count: 3, Kind: model.KindRandom, OrderNo: "snd-1"}, id, time.Now().Add(time.Hour).UnixMilli())
	if err != nil || rep || pk.ID != id || pk.Amount != 1200 || p.cuts.Load() != 2 {
		t.Fatalf("send with its COMMIT answer lost: %+v %v %v (cuts %d)", pk, rep, err, p.cuts.Load())
	}
	wantRows(t, direct, s, act, 2, 3800)
}

// TestCommitLost: a COMMIT that never reached the server leaves nothing
// applied; the call answers with an error, and its retry applies it once.
func TestCommitLost(t *testing.T) {
	m, p := openCut(t, false)
	direct := openStore(t)
	ctx := context.Background()
	act := testenv.Prefix() + "-cut"
	s := sharding.ShardOfAct(act)
	if _, err := Account(ctx, m, s, act); err != nil {
		t.Fatal(err)
	}
	p.arm(p.forward.Load())
	if d, err := Deposit(ctx, m, s, act, "dep-1", 700); err == nil || p.cuts.Load() != 1 {
		t.Fatalf("deposit whose COMMIT was cut: %+v, %v (cuts %d)", d, err, p.cuts.Load())
	}
	wantRows(t, direct, s, act, 0, 0)
	d, err := Deposit(ctx, m, s, act, "dep-1", 700)
	if err != nil || d.Repeat || d.Balance != 700 {
		t.Fatalf("retry: %+v, %v", d, err)
	}
	wantRows(t, direct, s, act, 1, 700)
}

// wantRows checks act's flow rows and balance in the database.
func wantRows(t *testing.T, m *MySQL, s model.ShardID, act string, flows int, balance model.Cents) {
	t.Helper()
	var n int
	if err := m.db.QueryRow("SELECT COUNT(*) FROM "+m.flowTable(s)+" WHERE act_id = ?", act).Scan(&n); err != nil {
		t.Fatal(err)
	}
	a, err := Account(context.Background(), m, s, act)
	if err != nil {
		t.Fatal(err)
	}
	if n != flows || a.Balance != balance {
		t.Fatalf("%s: %d flow rows, balance %d; want %d and %d", act, n, a.Balance, flows, balance)
	}
}
