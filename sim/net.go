package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"redcell/api"
	"redcell/model"
)

type msgKind int8

const (
	msgRequest    msgKind = iota // client → router → cell
	msgAnswer                    // cell → router → client
	msgCredits                   // a relay → the claimants' cell
	msgCreditsAck                // the claimants' cell → the relay
)

var msgNames = [...]string{"request", "answer", "credits", "credits-ack"}

// message is what travels on the simulated network. A duplicated message is
// delivered twice as the same value: no handler changes a message.
type message struct {
	kind     msgKind
	id       uint64 // the client's attempt, or the relay's delivery
	req      *request
	ans      *answer
	from     int // the sending cell of credits
	credits  []model.Credit
	deferred []string
}

type opKind int8

const (
	opDeposit opKind = iota
	opSend
	opOpen
	opGrab
	opAccount
)

var opNames = [...]string{"deposit", "send", "open", "grab", "account"}

// request is one client request, its body in the api's wire types.
type request struct {
	kind     opKind
	actID    string // the account (deposit, account) or the opener (open)
	packetID string // open, grab
	deposit  api.DepositRequest
	send     api.SendRequest
}

// answer is a cell's (or the router's) answer: an error envelope, or the
// operation's result.
type answer struct {
	err     *api.ErrorDetail
	deposit model.Deposit
	send    api.SendResponse
	open    api.OpenResponse
	grab    api.GrabResponse
	account model.Account
}

// errAnswer renders err as the api does (api.ErrorJSON) and reads the
// envelope back, so the code and the retryable flag are production's.
func errAnswer(err error) *answer {
	_, body := api.ErrorJSON(err)
	var b api.ErrorBody
	if jerr := json.Unmarshal(body, &b); jerr != nil {
		panic("sim: api.ErrorJSON wrote " + string(body))
	}
	return &answer{err: &b.Error}
}

// send puts m on the network from node from to node to: it may be lost,
// delayed (reordering it behind later messages) or delivered twice.
func (w *world) send(from, to int, m *message) {
	ln := w.log.begin(w, "net").i(int64(from)).i(int64(to)).s(msgNames[m.kind]).i(int64(m.id))
	f := w.faults
	if w.cut[from][to] {
		w.count("net.cut")
		ln.s("cut").end()
		return
	}
	if f.Drop > 0 && w.rngNet.Float64() < f.Drop {
		w.count("net.drop")
		ln.s("drop").end()
		return
	}
	copies := 1
	if f.Duplicate > 0 && w.rngNet.Float64() < f.Duplicate {
		copies = 2
		w.count("net.duplicate")
	}
	for i := 0; i < copies; i++ {
		d := f.LatencyMinMS + w.rngNet.Int64N(f.LatencyMaxMS-f.LatencyMinMS+1)
		if f.Slow > 0 && f.SlowMaxMS > 0 && w.rngNet.Float64() < f.Slow {
			d += w.rngNet.Int64N(f.SlowMaxMS) + 1
			w.count("net.slow")
		}
		ln = ln.kv("d", d)
		w.at(time.Duration(d)*time.Millisecond, func() { w.deliver(to, m) })
	}
	ln.end()
}

// deliver hands m to node to; a cell that is down loses it.
func (w *world) deliver(to int, m *message) {
	switch {
	case to == nodeClient:
		w.client.receive(m)
	case to == nodeRouter:
		w.router.receive(m)
	default:
		c := w.cells[to-nodeCell0]
		if c.down {
			w.count("net.to_down_cell")
			w.log.begin(w, "lost-at-down-cell").i(int64(to)).s(msgNames[m.kind]).i(int64(m.id)).end()
			return
		}
		c.receive(m)
	}
}

// router is the stateless router: it finds the shard of a request's key, the
// cell that owns it, and forwards; answers go back to the client. Its view of
// which cells are up lags the truth by membershipLag, as memberlist's does.
type router struct {
	w    *world
	down [cellCount]bool
}

// membershipLag is how long the router takes to see a cell leave or come back.
const membershipLag = 300 * time.Millisecond

func (r *router) receive(m *message) {
	w := r.w
	switch m.kind {
	case msgAnswer:
		w.send(nodeRouter, nodeClient, m)
	case msgRequest:
		s, err := keyShard(m.req, api.MatchPublic)
		if err != nil {
			w.send(nodeRouter, nodeClient, &message{kind: msgAnswer, id: m.id, ans: errAnswer(err)})
			return
		}
		cell, ok := w.smap.Owner(s)
		if !ok {
			panic(fmt.Sprintf("sim: shard %d has no owner in the cluster map", s))
		}
		owner := w.cellIndex(cell.Name)
		if r.down[owner] {
			w.count("router.cell_unavailable")
			w.send(nodeRouter, nodeClient, &message{kind: msgAnswer, id: m.id,
				ans: errAnswer(model.Errorf(model.ErrCellUnavailable, "no live cell owns shard %d", s))})
			return
		}
		w.send(nodeRouter, nodeCell0+owner, m)
	default:
		panic("sim: router got " + msgNames[m.kind])
	}
}

// httpOf is request q as a client puts it on the wire: its method, its path
// from api's path builders and, for a send, its JSON body (the only body a
// shard is read from; the others are not needed to route).
func httpOf(q *request) (method, path string, body []byte) {
	switch q.kind {
	case opDeposit:
		return http.MethodPost, api.DepositPath(q.actID), nil
	case opSend:
		b, err := json.Marshal(q.send)
		if err != nil {
			panic("sim: marshal a send: " + err.Error())
		}
		return http.MethodPost, api.SendPath, b
	case opOpen:
		return http.MethodPost, api.OpenPath(q.packetID), nil
	case opGrab:
		return http.MethodPost, api.GrabPath(q.packetID), nil
	case opAccount:
		return http.MethodGet, api.AccountPath(q.actID), nil
	}
	panic(fmt.Sprintf("sim: no HTTP form of operation %d", q.kind))
}

// routeOfOp is the route each operation must match.
var routeOfOp = [...]api.RouteID{opDeposit: api.RouteDeposit, opSend: api.RouteSend, opOpen: api.RouteOpen,
	opGrab: api.RouteGrab, opAccount: api.RouteAccount}

// keyShard is the shard request q goes to, found as router/ finds it: its
// method and path matched in api's route table (match: api.MatchPublic at the
// router, api.Match at a cell), then the key the route names — the path's
// act_id, the body's sender or the path's packet ID — through api.Locate.
// Errors: those of match and api.Locate (ErrNotFound, ErrInvalidArgument).
func keyShard(q *request, match func(method string, parts []string) (api.Route, api.Params, error)) (model.ShardID, error) {
	method, path, body := httpOf(q)
	parts, ok := api.PathSegments([]byte(path))
	if !ok {
		return 0, model.Errorf(model.ErrNotFound, "no route for %s", path)
	}
	rt, p, err := match(method, parts)
	if err != nil {
		return 0, err
	}
	if rt.ID != routeOfOp[q.kind] {
		panic(fmt.Sprintf("sim: %s %s matched route %s", method, path, rt.Label))
	}
	s, _, err := api.Locate(rt, p.Key, body)
	return s, err
}
