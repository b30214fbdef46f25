package cell

import (
	"context"
	"errors"
	mrand "math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/cell/groupcommit"
	"redcell/cell/keyqueue"
	"redcell/cell/relay"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// openJob is one open waiting in its packet's FIFO.
type openJob struct {
	sp       *space
	ref      model.PacketRef
	req      model.OpenRequest
	enqueued time.Time
	deadline time.Time
	done     chan model.OpenResult // buffered 1: the worker never blocks on it
}

// txTimeout bounds one open transaction, including the wait for its slot.
const txTimeout = 5 * time.Second

// open handles POST /v1/packets/{id}/open: the hot path of DESIGN.md §4.
func (s *Server) open(ctx context.Context, rc *fasthttp.RequestCtx, sp *space, id string) {
	ref, actID, ok := s.parts.packets.packetAndActor(rc, id)
	if !ok {
		return
	}
	req := model.OpenRequest{ActID: actID, Shard: sharding.ShardOfAct(actID)}
	if err := s.creditShed(sp); err != nil {
		s.answers.err(rc, err)
		return
	}
	s.opens.stats.opensInFlight.Add(1) // the relay's load probe (loaded)
	defer s.opens.stats.opensInFlight.Add(-1)
	var res model.OpenResult
	switch age := s.clock.Now().UTC().Sub(time.Date(ref.Year, ref.Month, ref.Day, 0, 0, 0, 0, time.UTC)); {
	case age < -24*time.Hour:
		// Dated after tomorrow: no cell has made it. Answered without a queue, so
		// made-up IDs cannot fill the cell with per-packet workers.
		res = model.OpenResult{Err: model.Errorf(model.ErrNotFound, "red packet %s not found", ref.ID)}
	case age > s.cfg.PacketExpiry+48*time.Hour:
		res = openOld(ctx, sp, ref, req) // long expired: no share can be paid, no queue needed
	case s.opens.strategy.Strategy().Strategy == StrategyNaive:
		res = s.openNaive(ctx, sp, ref, req)
	default:
		res = s.openQueued(ctx, sp, ref, req)
	}
	if res.Err != nil {
		s.answers.err(rc, res.Err)
		return
	}
	s.writeOpen(rc, res)
}

// writeOpen renders api.OpenResponse by hand: it is on the hot path, and every
// field is a validated token or an integer, so nothing needs escaping.
func (s *Server) writeOpen(rc *fasthttp.RequestCtx, res model.OpenResult) {
	c := res.Claim
	b := rc.Response.BodyWriter()
	buf := make([]byte, 0, 192)
	buf = append(buf, `{"claim_id":"`...)
	buf = append(buf, c.ID...)
	buf = append(buf, `","packet_id":"`...)
	buf = append(buf, c.PacketID...)
	buf = append(buf, `","act_id":"`...)
	buf = append(buf, c.ActID...)
	buf = append(buf, `","amount":`...)
	buf = strconv.AppendInt(buf, int64(c.Amount), 10)
	buf = append(buf, `,"seq":`...)
	buf = strconv.AppendInt(buf, c.Seq, 10)
	buf = append(buf, `,"repeat":`...)
	buf = strconv.AppendBool(buf, res.Repeat)
	buf = append(buf, '}')
	rc.SetStatusCode(http.StatusOK)
	rc.SetContentType("application/json")
	rc.Response.Header.Set(api.HeaderCell, s.cfg.Name)
	_, _ = b.Write(buf)
}

// openNaive runs the open as its own transaction right away: concurrent opens of
// one packet fight for the row lock. Kept as the baseline the bench compares with.
func (s *Server) openNaive(ctx context.Context, sp *space, ref model.PacketRef, req model.OpenRequest) model.OpenResult {
	if final := sp.closed.get(ref.ID); final != nil {
		results, err := answerClosed(ctx, sp, ref, []model.OpenRequest{req}, final)
		if err != nil {
			return model.OpenResult{Err: err}
		}
		return results[0]
	}
	// The open writes the packet's database: work a freeze of it waits for,
	// checked again inside (the handler's check may be from before a freeze).
	leave := s.own.enterDB(ref.Shard.DB())
	defer leave()
	if err := s.own.check(ref.Shard); err != nil {
		return model.OpenResult{Err: err}
	}
	r := s.opens.rngs.Get().(*mrand.Rand)
	defer s.opens.rngs.Put(r)
	s.metrics.batchSize.Observe(1)
	results, p, err := s.writer.openAlone(ctx, sp, ref, []model.OpenRequest{req}, r)
	if err != nil {
		return model.OpenResult{Err: err}
	}
	if s.afterOpen(sp, p, results) {
		s.opens.cache.set(sp, p)
	}
	return results[0]
}

// openOld answers an open of a packet created long before its expiry: the
// earlier claim if this user has one, else SOLD_OUT or EXPIRED.
func openOld(ctx context.Context, sp *space, ref model.PacketRef, req model.OpenRequest) model.OpenResult {
	p, err := storage.Packet(ctx, sp.store, ref)
	if err != nil {
		return model.OpenResult{Err: err}
	}
	final := error(model.ErrExpired)
	if p.RemainingCount == 0 && p.Status != model.StatusRefunded {
		final = model.ErrSoldOut
	}
	results, err := answerClosed(ctx, sp, ref, []model.OpenRequest{req}, final)
	if err != nil {
		return model.OpenResult{Err: err}
	}
	return results[0]
}

// queueKey names a packet's FIFO: real and stress traffic never share one.
type queueKey struct {
	id     model.PacketID
	stress bool
}

// closedSet holds packets whose state is final. Bounded: when full it is
// cleared, which only costs a transaction per packet to learn the state again.
type closedSet struct {
	mu sync.Mutex // guards m
	m  map[model.PacketID]error
}

const closedSetMax = 100_000

func (c *closedSet) get(id model.PacketID) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[id]
}

func (c *closedSet) put(id model.PacketID, final error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= closedSetMax {
		c.m = make(map[model.PacketID]error)
	}
	c.m[id] = final
}

// answerClosed answers opens of a packet that cannot pay out again: users who
// claimed before get their claim back, the rest get the final error.
func answerClosed(ctx context.Context, sp *space, ref model.PacketRef, reqs []model.OpenRequest, final error) ([]model.OpenResult, error) {
	earlier, err := storage.ClaimsOf(ctx, sp.store, ref, reqs)
	if err != nil {
		return nil, err
	}
	return model.ClosedResults(reqs, earlier, final), nil
}

// openQueued puts the open in its packet's FIFO and waits for the worker's answer
// or the request deadline.
func (s *Server) openQueued(ctx context.Context, sp *space, ref model.PacketRef, req model.OpenRequest) model.OpenResult {
	dl, _ := ctx.Deadline()
	job := &openJob{sp: sp, ref: ref, req: req, enqueued: s.clock.Now(), deadline: dl, done: make(chan model.OpenResult, 1)}
	s.metrics.queued.Inc() // before Enqueue: the worker may take the job at once
	if err := s.opens.queue.Enqueue(queueKey{id: ref.ID, stress: sp.stress}, job); err != nil {
		s.metrics.queued.Dec()
		s.opens.stats.shed.Add(1)
		if errors.Is(err, keyqueue.ErrClosed) {
			s.metrics.shed[shedShutdown].Inc()
			return model.OpenResult{Err: model.ErrShuttingDown}
		}
		s.metrics.shed[shedQueueFull].Inc()
		return model.OpenResult{Err: model.Errorf(model.ErrOverloaded, "the queue of red packet %s is full", ref.ID)}
	}
	select {
	case res := <-job.done:
		return res
	case <-ctx.Done():
		// The worker may still commit this open; a retry returns that claim.
		return model.OpenResult{Err: model.Errorf(model.ErrTimeout, "open of %s did not finish before the deadline", ref.ID)}
	}
}

// openBatch is the packet worker: it sheds jobs that waited too long, takes the
// packet's transaction slot in memcached, runs one transaction for the rest
// (under grouped: joins the packet's commit lane with them, one op of the
// lane's group) and answers every waiter.
func (s *Server) openBatch(qk queueKey, batch []*openJob) {
	key, sp := qk.id, batch[0].sp
	now := s.clock.Now()
	s.metrics.queued.Sub(float64(len(batch)))
	live := batch[:0:0] // filled here, not by a helper: the first 4 jobs' backing stays on the stack
	for _, j := range batch {
		if !s.shedStale(key, j, now) {
			live = append(live, j)
		}
	}
	if len(live) == 0 {
		return
	}
	// The batch writes the packet's database only: under grouped through the
	// committer, whose group is work a freeze of that database waits for and
	// checks the shard itself (commitGroup); otherwise in a transaction of
	// its own, and the batch is that work (enterDB). Either way it checks the
	// shard is still served (the handler's own check may be from before a
	// freeze). The strategy is read once: the work and the path agree.
	grouped := s.opens.strategy.grouped()
	if !grouped {
		leave := s.own.enterDB(live[0].ref.Shard.DB())
		defer leave()
	}
	if err := s.own.check(live[0].ref.Shard); err != nil {
		answerJobs(live, nil, err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), txTimeout)
	defer cancel()
	reqs := make([]model.OpenRequest, len(live))
	for i, j := range live {
		reqs[i] = j.req
	}
	if final := sp.closed.get(key); final != nil {
		results, err := answerClosed(ctx, sp, live[0].ref, reqs, final)
		answerJobs(live, results, err)
		return
	}
	// Under grouped a lone open takes no memcached slot. The slot keeps many
	// transactions off one hot packet row; a batch of one is a packet whose
	// FIFO held no one else (a cold packet), and it is one op in a group
	// shared with other keys. Its four memcached round trips (get, add; get,
	// cas) cost more CPU than its share of the group's commit. A packet that
	// turns hot batches its opens and takes the slot again.
	release := func() {}
	if !grouped || len(live) > 1 {
		var err error
		if release, err = s.opens.slots.Acquire(ctx, string(key)); err != nil {
			s.opens.stats.shed.Add(int64(len(live)))
			s.metrics.shed[shedNoSlot].Add(float64(len(live)))
			answerJobs(live, nil, model.Errorf(model.ErrOverloaded, "no transaction slot for red packet %s", key))
			return
		}
	}
	results, p, err := s.commitOpens(ctx, sp, live[0].ref, reqs, grouped, now)
	release()
	s.batchDone(sp, key, live, p, results, err, now)
}

// shedStale answers and counts job j of packet key, taken at now, when it
// waited longer than QueueWaitMax or past its deadline, and reports whether
// it did.
func (s *Server) shedStale(key model.PacketID, j *openJob, now time.Time) bool {
	s.metrics.queueWait.Observe(now.Sub(j.enqueued).Seconds())
	switch {
	case now.Sub(j.enqueued) > s.cfg.QueueWaitMax:
		s.opens.stats.shed.Add(1)
		s.metrics.shed[shedQueueWait].Inc()
		j.done <- model.OpenResult{Err: model.Errorf(model.ErrOverloaded, "waited %s in the queue of red packet %s", now.Sub(j.enqueued).Round(time.Millisecond), key)}
	case !j.deadline.IsZero() && now.After(j.deadline):
		s.metrics.shed[shedDeadline].Inc()
		j.done <- model.OpenResult{Err: model.ErrTimeout}
	default:
		return false
	}
	return true
}

// commitOpens commits one packet's batch of opens, reqs, which began at
// now, with a random source of the pool: in its lane's group (grouped: a
// group whose outcome stays unknown has the relay read back the claims
// from a second before now) or in a transaction of its own. The answers
// are storage.OpenBatch's.
func (s *Server) commitOpens(ctx context.Context, sp *space, ref model.PacketRef, reqs []model.OpenRequest, grouped bool, now time.Time) ([]model.OpenResult, model.Packet, error) {
	r := s.opens.rngs.Get().(*mrand.Rand)
	s.metrics.batchSize.Observe(float64(len(reqs)))
	var results []model.OpenResult
	var p model.Packet
	var err error
	if grouped {
		results, p, err = s.writer.openGrouped(ctx, sp, ref, reqs, r, now.Add(-time.Second))
	} else {
		results, p, err = s.writer.openAlone(ctx, sp, ref, reqs, r)
	}
	if !errors.Is(err, groupcommit.ErrInFlight) {
		s.opens.rngs.Put(r) // else the group still draws from r: leave it to the collector
	}
	return results, p, err
}

// batchDone answers the live jobs of packet key after their commit, which
// the batch began at now: each its result (err nil), or err. A commit that
// may have written claims no answer carries has the relay read them back;
// a failure not of shedding is tracked as an incident.
func (s *Server) batchDone(sp *space, key model.PacketID, live []*openJob, p model.Packet, results []model.OpenResult, err error, now time.Time) {
	track := s.inc.openBatch[sp.index()]
	if err != nil {
		if !errors.Is(err, groupcommit.ErrInFlight) && (errors.Is(err, model.ErrTimeout) || errors.Is(err, storage.ErrCommitUnknown)) {
			// The claims may be committed though no answer says so, and
			// their retries are repeats, which hand no credit to the relay:
			// it reads this database's claims made since the batch began
			// at its next pass. (A group still committing hands them over
			// when it ends: openGrouped.)
			sp.relay.MarkDB(live[0].ref.Shard.DB(), now.Add(-time.Second)) // the claims are stamped after the batch began
		}
		if errors.Is(err, model.ErrDBUnavailable) || errors.Is(err, model.ErrTimeout) || errors.Is(err, model.ErrOverloaded) ||
			errors.Is(err, model.ErrShuttingDown) {
			// The database breaker counts and logs outages; one line per batch would
			// flood. Under grouped, a deadline passed in the commit lane, a full lane
			// and a stopped committer are shedding, counted by the request metrics.
			s.log.Debug("open batch failed", "packet", key, "batch", len(live), "err", err)
		} else {
			track.Fail(err, "packet", key, "batch", len(live))
		}
		answerJobs(live, nil, err)
		return
	}
	track.OK()
	s.opens.stats.openBatches.Add(1)
	cache := s.afterOpen(sp, p, results)
	answerJobs(live, results, nil)
	// The grab cache's copy is written after the answers: its memcached
	// round trip is off every opener's path. It stays in this packet's
	// worker, so the next batch's copy cannot overtake it.
	if cache {
		s.opens.cache.set(sp, p)
	}
}

// answerJobs answers each job its result, results[i] to jobs[i]; err
// non-nil: every job err.
func answerJobs(jobs []*openJob, results []model.OpenResult, err error) {
	for i, j := range jobs {
		if err != nil {
			j.done <- model.OpenResult{Err: err}
		} else {
			j.done <- results[i]
		}
	}
}

// afterOpen hands new claims to the relay and notes a packet the open closed.
// It reports whether the grab cache's copy of p is to be refreshed (a claim
// taken or the packet closed), which the caller does once it has answered.
func (s *Server) afterOpen(sp *space, p model.Packet, results []model.OpenResult) bool {
	credits := relay.NewCredits(results) // a user listed twice in a batch is credited once
	fresh := len(credits)
	credits = slices.DeleteFunc(credits, func(c model.Credit) bool { return creditedHere(results, c.ClaimID) })
	if len(credits) < fresh {
		s.opens.stats.creditedInOpen.Add(int64(fresh - len(credits)))
		if ref, err := model.ParsePacketID(string(p.ID)); err == nil {
			sp.relay.Came(ref.Shard.DB()) // its position moves past them
		}
	}
	for i := range credits {
		// Where the store's claim rows say they go, as it named it a moment
		// ago: a lane delivering elsewhere (the map changed since) asks there
		// first.
		credits[i].Dest = s.creditDest(credits[i].Shard)
	}
	s.opens.stats.opens.Add(int64(fresh))
	final := model.FinalErr(p, s.clock.Now().UnixMilli())
	closed := final != nil
	if closed {
		sp.closed.put(p.ID, final)
	}
	if len(credits) > 0 {
		sp.relay.Enqueue(credits)
	}
	return fresh > 0 || closed
}

// creditedHere tells whether claim id was credited in its open's own
// transaction (model.OpenResult.Credited): the relay has nothing to deliver.
func creditedHere(results []model.OpenResult, id string) bool {
	for _, r := range results {
		if r.Credited && r.Claim.ID == id {
			return true
		}
	}
	return false
}
