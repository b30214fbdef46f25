package sim

import (
	"fmt"
	"math/rand/v2"
	"time"

	"redcell/api"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// cell is the simulator's model of one cell: its store is durable (it
// survives a crash); everything else — opens waiting for their batch,
// answers not sent yet, the relay's lanes and deliveries, the timers — is
// volatile and lost when the cell crashes.
type cell struct {
	w      *world
	idx    int
	node   int
	name   string
	store  storage.Store
	shards []model.ShardID // owned, ascending
	dbs    []int           // databases holding owned shards, ascending
	rng    *rand.Rand      // the split of opens, packet IDs

	down   bool
	epoch  int // bumped by crash and restart: timers of another epoch are void
	passes int // expiry passes since the run began

	opens map[model.PacketID]*openQueue // opens waiting for their batch; looked up, never iterated
	// closed holds packets whose state is final (sold out, expired,
	// refunded) and the error their opens get, as cell/open.go's closedSet:
	// opens of them are answered from ClaimsOf without a batch. Looked up,
	// never iterated; emptied when it reaches closedMax.
	closed map[model.PacketID]error
	relay  *relay
	// lanes holds, when the run is Grouped, the ops waiting for their
	// database's next group; looked up by database, never iterated.
	lanes map[int][]pendingOp
	// openBusy: Grouped, packets with a batch in a lane; looked up, never iterated.
	openBusy map[model.PacketID]bool
}

// pendingOp is an op waiting in its lane, and what to do with its answers.
type pendingOp struct {
	op   storage.MoneyOp
	done func(err error)
}

// closedMax bounds closed (cell/open.go closedSetMax).
const closedMax = 100_000

type openQueue struct {
	ref     model.PacketRef
	waiting []openWaiter
}

type openWaiter struct {
	id  uint64 // the client's attempt
	req model.OpenRequest
}

func newCell(w *world, i int) *cell {
	c := &cell{w: w, idx: i, node: nodeCell0 + i, name: cellName(i), rng: stream(w.cfg.Seed, streamCell+uint64(i))}
	c.store = newStore(w)
	if w.cfg.Plant == PlantCreditTwice {
		c.store = &creditTwice{Store: c.store, owns: c.owns}
	}
	for s := model.ShardID(0); s < model.ShardCount; s++ {
		if w.cellOf(s) == i {
			c.shards = append(c.shards, s)
			if len(c.dbs) == 0 || c.dbs[len(c.dbs)-1] != s.DB() {
				c.dbs = append(c.dbs, s.DB())
			}
		}
	}
	return c
}

func (c *cell) owns(s model.ShardID) bool { return c.w.cellOf(s) == c.idx }

// start begins the cell's volatile life: empty queues, a new relay, the
// relay's and expiry's timers.
func (c *cell) start() {
	c.epoch++
	c.opens = map[model.PacketID]*openQueue{}
	c.closed = map[model.PacketID]error{}
	c.lanes, c.openBusy = map[int][]pendingOp{}, map[model.PacketID]bool{}
	c.relay = newRelay(c)
	c.every(relayInterval, c.relay.tick)
	c.every(expiryInterval, c.expire)
}

// every runs fn every d while this life of the cell lasts.
func (c *cell) every(d time.Duration, fn func()) {
	epoch := c.epoch
	var tick func()
	tick = func() {
		if c.epoch != epoch {
			return
		}
		fn()
		if c.epoch == epoch {
			c.w.at(d, tick)
		}
	}
	c.w.at(d, tick)
}

// later runs fn after d unless the cell crashes first.
func (c *cell) later(d time.Duration, fn func()) {
	epoch := c.epoch
	c.w.at(d, func() {
		if c.epoch == epoch {
			fn()
		}
	})
}

// crash loses everything volatile; the router notices after membershipLag.
func (c *cell) crash() {
	c.down = true
	c.epoch++
	c.opens, c.closed, c.relay, c.lanes, c.openBusy = nil, nil, nil, nil, nil
	c.w.count("cell.crash")
	c.w.log.begin(c.w, "crash").s(c.name).end()
	c.w.at(membershipLag, func() { c.w.router.down[c.idx] = c.down })
}

// restart starts the cell again on its store.
func (c *cell) restart() {
	c.down = false
	c.start()
	c.w.count("cell.restart")
	c.w.log.begin(c.w, "restart").s(c.name).end()
	c.w.at(membershipLag, func() { c.w.router.down[c.idx] = c.down })
}

// maybeFailCommit arms the store's fault hook before a call that writes.
func (c *cell) maybeFailCommit() {
	f := c.w.faults.StoreFail
	if f == 0 || c.w.rngFault.Float64() >= f {
		return
	}
	lost := c.w.rngFault.IntN(2) == 0
	if h, ok := c.store.(commitFailer); ok {
		h.FailNextCommit(lost)
		c.w.count("store.fail_commit")
		c.w.log.begin(c.w, "fail-next-commit").s(c.name).kv("lost_answer", b2i(lost)).end()
	}
}

// commitFailer is the in-memory store's fault hook: the next COMMIT fails;
// with lostAnswer it is applied all the same.
type commitFailer interface{ FailNextCommit(lostAnswer bool) }

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// commit runs op: at once as its single-op store call (the fault hook armed
// before it, as before every call that writes), or, when the run is
// Grouped, in the next group of database db's lane. done gets the error of
// the call or of the whole group; the op's own answers and errors are in op.
func (c *cell) commit(db int, op storage.MoneyOp, done func(err error)) {
	if !c.w.cfg.Grouped {
		c.maybeFailCommit()
		done(c.single(op))
		return
	}
	if len(c.lanes[db]) == 0 {
		c.later(groupLinger, func() { c.flushLane(db) })
	}
	c.lanes[db] = append(c.lanes[db], pendingOp{op: op, done: done})
}

// single runs op as its single-op store call, answers in op as CommitGroup
// would set them; a deposit's or send's refusal is the call's error.
func (c *cell) single(op storage.MoneyOp) error {
	ctx := c.w.ctx
	var err error
	switch op := op.(type) {
	case *storage.DepositOp:
		op.Deposit, err = storage.Deposit(ctx, c.store, op.Shard, op.ActID, op.OrderNo, op.Amount)
	case *storage.SendOp:
		op.Packet, op.Repeat, err = storage.Send(ctx, c.store, op.Shard, op.Req, op.PacketID, op.ExpiresMS)
	case *storage.OpenOp:
		op.Results, op.Packet, err = storage.OpenBatch(ctx, c.store, op.Ref, op.Reqs, op.Rand)
	case *storage.CreditsOp:
		op.Applied, op.Deferred, err = storage.ApplyCredits(ctx, c.store, op.Credits)
	}
	return err
}

// flushLane commits what waits in lane db, groupMax ops at a time, one group
// after the other, and hands each op its answer.
func (c *cell) flushLane(db int) {
	w := c.w
	for len(c.lanes[db]) > 0 {
		n := min(len(c.lanes[db]), groupMax)
		group := c.lanes[db][:n:n]
		c.lanes[db] = c.lanes[db][n:]
		ops := make([]storage.MoneyOp, n)
		for i, p := range group {
			ops[i] = p.op
		}
		c.maybeFailCommit()
		err := c.store.CommitGroup(w.ctx, storage.Ops(ops))
		ln := w.log.begin(w, "group").s(c.name).i(int64(db)).i(int64(n))
		if err != nil {
			code, _ := model.CodeOf(err)
			ln.s(code).end()
			w.count("group.failed")
		} else {
			ln.end()
			w.count("group.committed")
			w.counts["group.ops"] += int64(n)
		}
		for _, p := range group {
			p.done(err)
		}
	}
	delete(c.lanes, db)
}

func (c *cell) receive(m *message) {
	switch m.kind {
	case msgRequest:
		c.handle(m)
	case msgCredits:
		c.applyCredits(m)
	case msgCreditsAck:
		c.relay.ack(m)
	default:
		panic("sim: cell got " + msgNames[m.kind])
	}
}

// reply answers attempt id through the router after serviceTime; a crash in
// between loses the answer (the store call's effect stays).
func (c *cell) reply(id uint64, a *answer) {
	c.later(serviceTime, func() { c.w.send(c.node, nodeRouter, &message{kind: msgAnswer, id: id, ans: a}) })
}

func (c *cell) handle(m *message) {
	q, w := m.req, c.w
	s, err := keyShard(q, api.Match)
	if err == nil && !c.owns(s) {
		err = model.Errorf(model.ErrWrongCell, "shard %d is not owned by %s", s, c.name)
	}
	if err != nil {
		c.reply(m.id, errAnswer(err))
		return
	}
	switch q.kind {
	case opDeposit:
		c.deposit(m.id, s, q)
	case opSend:
		c.send(m.id, s, q)
	case opOpen:
		ref, _ := model.ParsePacketID(q.packetID)
		oq := c.opens[ref.ID]
		if oq == nil {
			oq = &openQueue{ref: ref}
			c.opens[ref.ID] = oq
			c.later(openLinger, func() { c.flushOpens(ref.ID) })
		}
		oq.waiting = append(oq.waiting, openWaiter{id: m.id, req: model.OpenRequest{ActID: q.actID, Shard: sharding.ShardOfAct(q.actID)}})
	case opGrab:
		c.grab(m.id, q)
	case opAccount:
		a, err := storage.Account(w.ctx, c.store, s, q.actID)
		if err != nil {
			c.reply(m.id, errAnswer(err))
			return
		}
		w.log.begin(w, "account").s(c.name).s(a.ActID).i(int64(a.Balance)).end()
		w.check.balance(c, a)
		c.reply(m.id, &answer{account: a})
	}
}

func (c *cell) deposit(id uint64, s model.ShardID, q *request) {
	w := c.w
	if err := q.deposit.Validate(); err != nil {
		c.reply(id, errAnswer(err))
		return
	}
	op := &storage.DepositOp{Shard: s, ActID: q.actID, OrderNo: q.deposit.OrderNo, Amount: model.Cents(q.deposit.Amount)}
	c.commit(s.DB(), op, func(err error) {
		if err == nil {
			err = op.Err
		}
		d := op.Deposit
		ln := w.log.begin(w, "deposit").s(c.name).s(q.actID).s(q.deposit.OrderNo).i(q.deposit.Amount)
		if err != nil {
			code, _ := model.CodeOf(err)
			ln.s(code).end()
			c.reply(id, errAnswer(err))
			return
		}
		ln.kv("balance", int64(d.Balance)).kv("repeat", b2i(d.Repeat)).end()
		w.check.depositApplied(c, s, d)
		c.reply(id, &answer{deposit: d})
	})
}

func (c *cell) send(id uint64, s model.ShardID, q *request) {
	w := c.w
	b := q.send
	req, err := b.Validate(model.DefaultLimits())
	if err != nil {
		c.reply(id, errAnswer(err))
		return
	}
	op := &storage.SendOp{Shard: s, Req: req, PacketID: c.newPacketID(s), ExpiresMS: w.timeNow().Add(packetExpiry).UnixMilli()}
	c.commit(s.DB(), op, func(err error) {
		if err == nil {
			err = op.Err
		}
		p, repeat := op.Packet, op.Repeat
		ln := w.log.begin(w, "send").s(c.name).s(b.Sender).s(b.OrderNo).i(b.Amount).i(b.Count)
		if err != nil {
			code, _ := model.CodeOf(err)
			ln.s(code).end()
			c.reply(id, errAnswer(err))
			return
		}
		ln.s(string(p.ID)).kv("repeat", b2i(repeat)).end()
		w.check.sent(c, s, req, p, repeat)
		c.reply(id, &answer{send: api.NewSendResponse(p, repeat)})
	})
}

// newPacketID makes a packet ID with model.PacketIDFrom, its random part
// from the cell's stream instead of crypto/rand, and checks it parses.
func (c *cell) newPacketID(s model.ShardID) model.PacketID {
	id := model.PacketIDFrom(s, c.w.timeNow(), c.rng.Uint64())
	if ref, err := model.ParsePacketID(string(id)); err != nil || ref.Shard != s {
		panic(fmt.Sprintf("sim: made packet ID %q: %v", id, err))
	}
	return id
}

func (c *cell) grab(id uint64, q *request) {
	w := c.w
	ref, _ := model.ParsePacketID(q.packetID)
	p, err := storage.Packet(w.ctx, c.store, ref)
	if err != nil {
		c.reply(id, errAnswer(err))
		return
	}
	st := model.StatusAt(p.Status, p.RemainingCount, p.ExpiresMS, w.timeNow().UnixMilli())
	w.log.begin(w, "grab").s(c.name).s(string(p.ID)).s(st).i(p.RemainingCount).end()
	c.reply(id, &answer{grab: api.NewGrabResponse(string(p.ID), st, p.RemainingCount, "db")})
}

// applyCredits is /internal/credits: book the credits here and answer which
// were deferred.
func (c *cell) applyCredits(m *message) {
	w := c.w
	c.bookCredits(m.credits, func(applied int, deferred []string, err error) {
		ln := w.log.begin(w, "apply-credits").s(c.name).i(int64(m.id)).i(int64(len(m.credits)))
		if err != nil {
			code, _ := model.CodeOf(err)
			ln.s(code).credits(m.credits).end()
			c.later(serviceTime, func() {
				w.send(c.node, nodeCell0+m.from, &message{kind: msgCreditsAck, id: m.id, ans: errAnswer(err)})
			})
			return
		}
		ln.kv("applied", int64(applied)).kv("deferred", int64(len(deferred))).credits(m.credits).end()
		w.counts["credits.applied"] += int64(applied)
		w.counts["credits.again"] += int64(len(m.credits) - applied - len(deferred))
		w.check.credited(c, m.credits, deferred)
		c.later(serviceTime, func() {
			w.send(c.node, nodeCell0+m.from, &message{kind: msgCreditsAck, id: m.id, deferred: deferred})
		})
	})
}

// bookCredits books credits here: one ApplyCredits call, or, when the run
// is Grouped, one op per database in those databases' lanes; done gets the
// sums once every part is answered (an error if any part failed).
func (c *cell) bookCredits(credits []model.Credit, done func(applied int, deferred []string, err error)) {
	if !c.w.cfg.Grouped {
		op := &storage.CreditsOp{Credits: credits}
		c.commit(0, op, func(err error) { done(op.Applied, op.Deferred, err) })
		return
	}
	var dbs []int
	byDB := map[int][]model.Credit{}
	for _, cr := range credits {
		db := cr.Shard.DB()
		if _, ok := byDB[db]; !ok {
			dbs = append(dbs, db) // first-seen order: deterministic
		}
		byDB[db] = append(byDB[db], cr)
	}
	left, applied := len(dbs), 0
	var deferred []string
	var failed error
	for _, db := range dbs {
		op := &storage.CreditsOp{Credits: byDB[db]}
		c.commit(db, op, func(err error) {
			if err != nil && failed == nil {
				failed = err
			}
			applied += op.Applied
			deferred = append(deferred, op.Deferred...)
			if left--; left == 0 {
				done(applied, deferred, failed)
			}
		})
	}
}

// expire is one pass of cell/expiry.go: the expired packets of the days a
// still-open packet could have been created on (every day slot on every
// tenth pass), each refunded at the simulated time.
func (c *cell) expire() {
	w := c.w
	days := model.ExpiryDays(w.timeNow(), packetExpiry)
	c.passes++
	if c.passes%10 == 0 {
		days = model.AllDays()
	}
	ids, err := storage.ExpiredIn(w.ctx, c.store, c.shards, days, w.timeNow().UnixMilli(), 500)
	if err != nil {
		w.count("expiry.scan_failed")
		return
	}
	for _, id := range ids {
		ref, err := model.ParsePacketID(string(id))
		if err != nil {
			w.fail("packet-id", []string{string(id)}, "ExpiredIn listed a bad packet ID %q: %v", id, err)
			return
		}
		c.maybeFailCommit()
		cents, err := storage.Refund(w.ctx, c.store, ref)
		ln := w.log.begin(w, "refund").s(c.name).s(string(id))
		if err != nil {
			code, _ := model.CodeOf(err)
			ln.s(code).end()
			w.check.refundFailed(ref)
			continue
		}
		ln.i(int64(cents)).end()
		w.check.refunded(c, ref, cents)
		if cents > 0 {
			c.close(ref.ID, model.ErrExpired)
		}
	}
}
