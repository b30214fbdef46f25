package sim

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"redcell/api"
	"redcell/model"
)

// client is the workload: callers that start operations at random, each
// retried under the same order number until it gets an answer that is not
// retryable or has been tried attemptsMax times; some operations repeat an
// earlier order outright. It keeps what it was told, for the checkers.
type client struct {
	w        *world
	rng      *rand.Rand
	users    []string
	started  int            // steps started
	requests int64          // attempts sent
	open     int            // operations not finished
	ops      []*op          // every operation, by step
	attempts map[uint64]*op // attempts awaiting an answer
	sent     map[uint64]*op // every attempt ever sent
	seen     map[*answer]bool

	packets      []knownPacket // answered sends, in answer order
	lastExpiryMS int64         // latest expiry of any packet answered, sim ms

	// What the clients were told, for the checkers.
	deposits     map[string]*depositBook // by order number
	depositOrder []string                // order numbers, first attempt order
	sends        map[string]*sendBook    // by order number
	claims       map[string]*claimBook   // by packet ID + "/" + act_id
	claimOrder   []string                // keys of claims, first answer order
	closedAt     map[string]int64        // packet ID → Unix ms a grab first saw it sold out or refunded
}

type op struct {
	step    int
	req     *request
	tries   int
	attempt uint64 // the attempt awaiting an answer (0: none)
	done    bool
}

type knownPacket struct {
	id        string
	expiresMS int64
}

type depositBook struct {
	actID    string
	amount   int64
	answered bool
	fresh    bool        // an answer with Repeat false was seen
	balance  model.Cents // the balance the first answer gave
}

type sendBook struct {
	packetID string
	fresh    bool
}

type claimBook struct {
	claimID, packetID, actID string
	amount                   int64
	fresh                    bool
}

func newClient(w *world) *client {
	c := &client{w: w, rng: stream(w.cfg.Seed, streamClient), attempts: map[uint64]*op{}, sent: map[uint64]*op{}, seen: map[*answer]bool{},
		deposits: map[string]*depositBook{}, sends: map[string]*sendBook{}, claims: map[string]*claimBook{}, closedAt: map[string]int64{}}
	for i := 0; i < userCount; i++ {
		c.users = append(c.users, fmt.Sprintf("u%04d", i))
	}
	return c
}

func (c *client) inFlight() int { return c.open }

// begin schedules the first operation.
func (c *client) begin() { c.w.at(0, c.startNext) }

// startNext starts one operation and schedules the next.
func (c *client) startNext() {
	if c.started >= c.w.cfg.Steps {
		return
	}
	o := &op{step: c.started, req: c.generate()}
	c.started++
	c.ops = append(c.ops, o)
	c.open++
	c.issue(o)
	c.w.at(time.Duration(c.rng.Int64N(opGapMaxMS+1))*time.Millisecond, c.startNext)
}

// generate draws the next operation.
func (c *client) generate() *request {
	n := c.started
	user := c.users[c.rng.IntN(len(c.users))]
	roll := c.rng.IntN(100)
	if len(c.packets) == 0 && roll >= 27 {
		roll = 0 // nothing to open or grab yet: deposit
	}
	switch {
	case roll < 12:
		order := "d-" + strconv.Itoa(n)
		amount := 100 + c.rng.Int64N(100_000)
		c.deposits[order] = &depositBook{actID: user, amount: amount}
		c.depositOrder = append(c.depositOrder, order)
		return &request{kind: opDeposit, actID: user, deposit: api.DepositRequest{Amount: amount, OrderNo: order}}
	case roll < 27:
		count := 1 + c.rng.Int64N(30)
		amount := count + c.rng.Int64N(20_000)
		kind := string(model.KindRandom)
		if c.rng.IntN(4) == 0 {
			kind, amount = string(model.KindFixed), count*(1+c.rng.Int64N(500))
		}
		return &request{kind: opSend, send: api.SendRequest{Sender: user, Amount: amount, Count: count, Kind: kind,
			Greeting: "sim", OrderNo: "s-" + strconv.Itoa(n)}}
	case roll < 72:
		return &request{kind: opOpen, actID: user, packetID: c.pickPacket()}
	case roll < 82:
		return &request{kind: opGrab, packetID: c.pickPacket()}
	case roll < 87:
		return &request{kind: opAccount, actID: user}
	default:
		// Repeat an earlier deposit, send or open under its own order number.
		for tries := 0; tries < 4 && len(c.ops) > 0; tries++ {
			earlier := c.ops[c.rng.IntN(len(c.ops))]
			if k := earlier.req.kind; k == opDeposit || k == opSend || k == opOpen {
				c.w.count("client.repeat_order")
				return earlier.req
			}
		}
		return &request{kind: opAccount, actID: user}
	}
}

// pickPacket picks mostly among the 40 newest packets (a packet fills up while
// it is news), sometimes any.
func (c *client) pickPacket() string {
	n := len(c.packets)
	if c.rng.IntN(5) == 0 {
		return c.packets[c.rng.IntN(n)].id
	}
	return c.packets[n-1-c.rng.IntN(min(n, 40))].id
}

// issue sends one attempt of o.
func (c *client) issue(o *op) {
	w := c.w
	w.seq++
	id := w.seq
	o.tries++
	o.attempt = id
	c.attempts[id] = o
	c.sent[id] = o
	c.requests++
	w.log.begin(w, "attempt").i(int64(o.step)).i(int64(o.tries)).s(opNames[o.req.kind]).s(describe(o.req)).i(int64(id)).end()
	w.send(nodeClient, nodeRouter, &message{kind: msgRequest, id: id, req: o.req})
	w.at(requestTimeout, func() {
		if c.attempts[id] == o {
			delete(c.attempts, id)
			w.count("client.timeout")
			c.retry(o, "timeout")
		}
	})
}

func describe(q *request) string {
	switch q.kind {
	case opDeposit:
		return q.actID + " " + q.deposit.OrderNo + " " + strconv.FormatInt(q.deposit.Amount, 10)
	case opSend:
		return q.send.Sender + " " + q.send.OrderNo + " " + strconv.FormatInt(q.send.Amount, 10) + "/" + strconv.FormatInt(q.send.Count, 10)
	case opOpen:
		return q.packetID + " " + q.actID
	case opGrab:
		return q.packetID
	}
	return q.actID
}

// keysOf lists the keys a request names, for a trace.
func keysOf(q *request) []string {
	switch q.kind {
	case opDeposit:
		return []string{q.deposit.OrderNo, q.actID}
	case opSend:
		return []string{q.send.OrderNo, q.send.Sender}
	case opOpen:
		return []string{q.packetID, q.actID}
	case opGrab:
		return []string{q.packetID}
	}
	return []string{q.actID}
}

// retry tries o again after a backoff, or gives it up.
func (c *client) retry(o *op, why string) {
	if o.tries >= attemptsMax {
		c.w.count("client.gave_up")
		c.w.log.begin(c.w, "gave-up").i(int64(o.step)).s(why).end()
		c.finish(o)
		return
	}
	c.w.count("client.retry")
	back := time.Duration(10<<min(o.tries, 5)) * time.Millisecond
	c.w.at(back, func() { c.issue(o) })
}

func (c *client) finish(o *op) {
	o.done, o.attempt = true, 0
	c.open--
}

// receive takes an answer. Every answer is checked against what the clients
// were told before, a late one too (an attempt the client gave up on, or a
// request the network delivered twice); only the awaited one moves its
// operation on.
func (c *client) receive(m *message) {
	w := c.w
	o := c.sent[m.id]
	a := m.ans
	awaited := c.attempts[m.id] == o
	code := "OK"
	if a.err != nil {
		code = a.err.Code
	}
	ln := w.log.begin(w, "answer").i(int64(o.step)).s(opNames[o.req.kind]).s(describe(o.req)).s(code)
	if !awaited {
		w.count("client.stale_answer")
		ln = ln.s("stale")
	}
	ln.end()
	// A message the network duplicated is one answer, told twice.
	if a.err == nil && !c.seen[a] {
		c.seen[a] = true
		c.record(o.req, a)
		if w.violation != nil {
			return
		}
	}
	if !awaited {
		return
	}
	delete(c.attempts, m.id)
	w.count("answer." + opNames[o.req.kind] + "." + code)
	if a.err == nil {
		c.finish(o)
		return
	}
	if a.err.Retryable {
		c.retry(o, a.err.Code)
		return
	}
	c.finish(o)
	switch a.err.Code {
	case model.ErrOrderConflict.Code, model.ErrInvalidArgument.Code, model.ErrWrongCell.Code, model.ErrNotFound.Code:
		// The workload sends only valid requests, reuses an order number
		// only with its own body, routes by a static map, and opens only
		// packets a send answered.
		w.fail("unexpected-error", keysOf(o.req), "%s %s answered %s: %s", opNames[o.req.kind], describe(o.req), a.err.Code, a.err.Message)
	}
}

// record checks a successful answer against what the clients were told
// before and keeps it.
func (c *client) record(q *request, a *answer) {
	switch q.kind {
	case opDeposit:
		c.depositAnswer(q, a.deposit)
	case opSend:
		c.sendAnswer(q, a.send)
	case opOpen:
		c.openAnswer(q, a.open)
	case opGrab:
		if a.grab.Status == "sold_out" || a.grab.Status == "refunded" {
			if _, seen := c.closedAt[a.grab.PacketID]; !seen {
				c.closedAt[a.grab.PacketID] = c.w.timeNow().UnixMilli()
			}
		}
	}
}

func (c *client) depositAnswer(q *request, d model.Deposit) {
	w := c.w
	b := c.deposits[q.deposit.OrderNo]
	keys := []string{q.deposit.OrderNo, q.actID}
	if d.Amount != model.Cents(b.amount) || d.ActID != b.actID {
		w.fail("deposit-answer", keys, "deposit %s answered %+v for %d to %s", q.deposit.OrderNo, d, b.amount, b.actID)
		return
	}
	if !d.Repeat && b.fresh {
		w.fail("deposit-once", keys, "deposit %s was applied twice: two answers without repeat", q.deposit.OrderNo)
		return
	}
	if b.answered && d.Balance != b.balance {
		w.fail("deposit-answer", keys, "deposit %s answered balance %d, earlier %d", q.deposit.OrderNo, d.Balance, b.balance)
		return
	}
	b.answered, b.balance = true, d.Balance
	b.fresh = b.fresh || !d.Repeat
}

func (c *client) sendAnswer(q *request, s api.SendResponse) {
	w := c.w
	b := c.sends[q.send.OrderNo]
	keys := []string{q.send.OrderNo, s.PacketID}
	if s.Amount != q.send.Amount || s.Count != q.send.Count || s.Sender != q.send.Sender {
		w.fail("send-answer", keys, "send %s answered %+v for %+v", q.send.OrderNo, s, q.send)
		return
	}
	if b == nil {
		b = &sendBook{packetID: s.PacketID}
		c.sends[q.send.OrderNo] = b
		c.packets = append(c.packets, knownPacket{id: s.PacketID, expiresMS: s.ExpiresMS})
		if t := s.ExpiresMS - simStart.UnixMilli(); t > c.lastExpiryMS {
			c.lastExpiryMS = t
		}
	}
	if b.packetID != s.PacketID {
		w.fail("send-once", append(keys, b.packetID), "send %s answered packet %s, earlier %s", q.send.OrderNo, s.PacketID, b.packetID)
		return
	}
	if !s.Repeat && b.fresh {
		w.fail("send-once", keys, "send %s was applied twice: two answers without repeat", q.send.OrderNo)
		return
	}
	b.fresh = b.fresh || !s.Repeat
}

func (c *client) openAnswer(q *request, o api.OpenResponse) {
	w := c.w
	key := q.packetID + "/" + q.actID
	keys := []string{o.ClaimID, q.packetID, q.actID}
	if o.ActID != q.actID || o.PacketID != q.packetID || o.Amount < 1 || o.ClaimID != model.ClaimID(model.PacketID(o.PacketID), o.Seq) {
		w.fail("open-answer", keys, "open of %s by %s answered %+v", q.packetID, q.actID, o)
		return
	}
	b := c.claims[key]
	if b == nil {
		b = &claimBook{claimID: o.ClaimID, packetID: o.PacketID, actID: o.ActID, amount: o.Amount}
		c.claims[key] = b
		c.claimOrder = append(c.claimOrder, key)
	}
	if b.claimID != o.ClaimID || b.amount != o.Amount {
		w.fail("one-claim-per-user", append(keys, b.claimID), "%s was answered claim %s of %d, earlier %s of %d",
			key, o.ClaimID, o.Amount, b.claimID, b.amount)
		return
	}
	if !o.Repeat && b.fresh {
		w.fail("one-claim-per-user", keys, "%s got two answers without repeat for claim %s", key, o.ClaimID)
		return
	}
	if !o.Repeat {
		if t, closed := c.closedAt[q.packetID]; closed && w.check.claimCreatedMS(o.ClaimID) > t {
			w.fail("closed-stays-closed", keys, "claim %s was made after a grab saw packet %s closed at %d", o.ClaimID, q.packetID, t)
			return
		}
	}
	b.fresh = b.fresh || !o.Repeat
}
