package router

import (
	"errors"
	"net/http"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/api/cellclient"
	"redcell/internal/incident"
	"redcell/internal/retry"
	"redcell/model"
	"redcell/sharding"
)

// A cell that answers 421 WRONG_CELL does not own the shard (the map is
// changing), and one that answers 503 MOVING is handing the shard's database
// to another cell (the freeze of a move, about a second). Either way the router
// waits movedWait, doubling up to movedWaitMax, looks the owner up again and
// tries once more, for as long as movedLeftMin of the deadline is left for the
// next try (at most movedAttempts tries in all).
const (
	movedWait     = 50 * time.Millisecond
	movedWaitMax  = 400 * time.Millisecond
	movedAttempts = 12
	movedLeftMin  = 200 * time.Millisecond
)

// errMoved is a forward the owner answered 421 or MOVING (see movedWait);
// errMovedLate is one with too little of the deadline left to try again.
var (
	errMoved     = errors.New("router: the shard's owner answered 421 or MOVING")
	errMovedLate = errors.New("router: the shard's owner answered 421 or MOVING, no time left to retry")
)

// retryMoved is the Retryable of forwardWithRetry: a package func, not a
// closure, so that forwarding allocates nothing for it.
func retryMoved(err error) bool { return err == errMoved }

// movedAnswer reports whether the cell's answer says the shard is elsewhere
// or on its way there: 421, or 503 with the code MOVING.
func movedAnswer(resp *fasthttp.Response) bool {
	switch resp.StatusCode() {
	case fasthttp.StatusMisdirectedRequest:
		return true
	case fasthttp.StatusServiceUnavailable:
		return string(api.ResponseCode(&resp.Header)) == model.ErrMoving.Code
	}
	return false
}

// forwardWithRetry forwards to the shard's owner, again after a 421 or a
// MOVING answer (retry.Do; its wait ends early when the server shuts down). A
// request still refused when the tries or the deadline run out gets the
// retryable 503 MOVING rather than a final answer.
func (r *Router) forwardWithRetry(rc *fasthttp.RequestCtx, shard model.ShardID, start time.Time) {
	deadline := start.Add(r.cfg.RequestTimeout)
	err := retry.Do(rc, retry.Policy{Attempts: movedAttempts, Backoff: movedWait, Max: movedWaitMax, Retryable: retryMoved}, func(attempt int) error {
		if attempt > 0 {
			start = time.Now() // a later try is signed when it is sent
		}
		cell, ok := r.routes.Map().Owner(shard)
		if !ok {
			r.writeErr(rc, model.Errorf(model.ErrCellUnavailable, "no live cell owns shard %d", shard))
			return nil
		}
		if !r.forward(rc, cell, shard, deadline, start) || !movedAnswer(&rc.Response) {
			return nil
		}
		// Only when the wait and another try fit in the deadline: no wait
		// passes the request's deadline.
		if time.Until(deadline) < movedLeftMin+min(movedWait<<attempt, movedWaitMax) {
			return errMovedLate
		}
		return errMoved
	})
	if err != nil {
		r.writeErr(rc, model.Errorf(model.ErrMoving, "shard %d is moving between cells; retry", shard))
	}
}

// forward sends the request to the cell with the deadline header, signed, and
// copies the answer back; now is the time it is signed at. A cell that cannot
// be reached is a 503; a timeout a 504. It reports whether the cell answered.
func (r *Router) forward(rc *fasthttp.RequestCtx, cell sharding.Cell, shard model.ShardID, deadline, now time.Time) bool {
	// The client request is the server's own request object: fasthttp lets a
	// Request be sent as is, and forwarding without a copy keeps the router's
	// cost per request low (it is a hop on every call).
	req := &rc.Request
	req.SetHost(cell.Addr)
	req.URI().SetScheme("http") // a request that came in over TLS goes on to the cell in plain HTTP
	// The caller's API key stays here: cells trust the cluster's signature,
	// and the hop to them may not be encrypted.
	req.Header.Del(fasthttp.HeaderAuthorization)
	// Last, once the request is what the cell will read: the deadline header,
	// then the signature over the method, the request target (path and query,
	// as the request line will carry them), the stress flag, the app and the body,
	// replacing any signature headers the client sent. It allocates nothing.
	cellclient.Stamp(req, r.signer, deadline, now)
	resp := &rc.Response
	c := r.client(cell)
	err := c.hc.DoDeadline(req, resp, deadline)
	switch {
	case err == nil:
		c.down.OK()
		// Every 429 and 503 the router passes on asks the client to wait
		// (api.WriteErrorBody), the cell's too when the cell did not (a cell
		// of an older version during a rolling upgrade).
		if st := resp.StatusCode(); (st == http.StatusTooManyRequests || st == http.StatusServiceUnavailable) &&
			len(resp.Header.Peek(api.HeaderRetryAfter)) == 0 {
			resp.Header.Set(api.HeaderRetryAfter, "1")
		}
		return true
	case cellclient.Transport(err) == model.ErrTimeout:
		r.writeErr(rc, model.Errorf(model.ErrTimeout, "cell %s did not answer in time", cell.Name))
	default:
		// Logged when it starts, summarized while it lasts, and when it ends:
		// one line per refused request would flood the log in an outage.
		c.down.Fail(err, "shard", shard)
		r.writeErr(rc, model.Errorf(model.ErrCellUnavailable, "cell %s owning shard %d is unreachable", cell.Name, shard))
	}
	return false
}

// cellClient is the router's connection pool to one cell address, and that
// address's record of being unreachable.
type cellClient struct {
	hc   *fasthttp.HostClient
	down *incident.Tracker
	// started is the process at the address the pool's connections were
	// made to (sharding.Cell.Started): a cell started again on the same
	// address leaves the pool full of the old process's closed connections,
	// and a request sent on one fails (fasthttp resends only idempotent
	// ones), so the idle ones are closed when the map names a new process.
	started int64
}

// cellClientsMax bounds the pools kept: past it, pools of addresses that no
// longer own a shard (cells that moved) are dropped when a new one is made.
const cellClientsMax = 64

func (r *Router) client(cell sharding.Cell) *cellClient {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.clients[cell.Addr]
	if ok && c.started != cell.Started {
		c.hc.CloseIdleConnections()
		c.started = cell.Started
	}
	if !ok {
		if len(r.clients) >= cellClientsMax {
			live := map[string]bool{}
			for _, lc := range r.routes.Map().Cells() {
				live[lc.Addr] = true
			}
			for addr, old := range r.clients {
				if !live[addr] {
					old.hc.CloseIdleConnections()
					delete(r.clients, addr)
				}
			}
		}
		c = &cellClient{
			hc: &fasthttp.HostClient{
				// No ReadTimeout or WriteTimeout: every call is DoDeadline with
				// the request's deadline, which bounds the write and the read
				// already; the timeouts only added clock readings per call.
				Addr: cell.Addr, Name: "redcell-router", MaxConns: r.cfg.MaxConnsPerCell,
				MaxIdleConnDuration: 30 * time.Second, MaxConnWaitTimeout: r.cfg.RequestTimeout,
			},
			down:    incident.New(r.log.With("cell", cell.Name, "addr", cell.Addr), "forwarding to cell", incident.DefaultEvery),
			started: cell.Started,
		}
		r.clients[cell.Addr] = c
	}
	return c
}
