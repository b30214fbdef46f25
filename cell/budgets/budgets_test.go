package budgets

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/api/cellclient"
	"redcell/cell/activity"
	"redcell/internal/clock"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
	"redcell/storage/memstore"
)

// One parent whose official child's scene controls its stock: 100000 cents,
// none held back.
const activities = `
activities:
  - id: fest
    children:
      - id: fest-official
        stage: official
        start: 2027-01-31T20:00:00Z
        end: 2027-02-01T02:00:00Z
        rewards: [{id: r, scenes: [{id: rain, award_type: cash, amount: {min: 1, max: 888}, budget: 100000, rate_limit: {per_sec: 100, burst: 100}, pay_into: wallet, control_stock: true, reserve_percent: 0}]}]
`

var (
	start   = time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC)
	testKey = model.BudgetKey("fest", "fest-official", "rain")
)

// answers is Answers as the cell's answer writer does it, keeping the
// error answered for the client.
type answers struct{}

func (answers) JSON(rc *fasthttp.RequestCtx, status int, v any) {
	b, _ := json.Marshal(v)
	rc.SetStatusCode(status)
	rc.SetBody(b)
}

func (answers) Error(rc *fasthttp.RequestCtx, err error) {
	rc.SetUserValue("err", err)
	api.WriteError(rc, err)
}

// loopback is Client: a call to addr is served by the Keeper at it, in
// process, on the budget route of the call's path.
type loopback map[string]*Keeper

func (l loopback) Send(ctx context.Context, c cellclient.Call) error {
	routes := map[string]api.RouteID{api.BudgetLeasePath: api.RouteBudgetLease, api.BudgetReturnPath: api.RouteBudgetReturn,
		api.BudgetLeasesPath: api.RouteBudgetLeases}
	var rc fasthttp.RequestCtx
	body, _ := json.Marshal(c.Body)
	rc.Request.SetBody(body)
	space := 0
	if c.Stress {
		space = 1
	}
	l[c.Addr].Serve(ctx, &rc, routes[c.Path], space)
	if err, ok := rc.UserValue("err").(error); ok {
		return err
	}
	if c.Out != nil {
		return json.Unmarshal(rc.Response.Body(), c.Out)
	}
	return nil
}

type peers struct{ m *sharding.Map }

func (p peers) Map() *sharding.Map { return p.m }

// cluster is two cells: home owns every shard, far none; each space has
// its own memstore.
type cluster struct {
	clk        *clock.Manual
	home, far  *Keeper
	homeStores [2]*memstore.Store
}

func newCluster(t *testing.T) *cluster {
	tree, err := activity.Parse([]byte(activities), start)
	if err != nil {
		t.Fatal(err)
	}
	all, _ := sharding.ParseRanges("0-999")
	m, _ := sharding.NewMap([]sharding.Cell{{Name: "cell-h", Addr: "h:1", Shards: all}, {Name: "cell-f", Addr: "f:1"}})
	c := &cluster{clk: clock.NewManual(start)}
	calls := loopback{}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	keeper := func(name string, owns bool) (*Keeper, [2]*memstore.Store) {
		stores := [2]*memstore.Store{memstore.New(c.clk), memstore.New(c.clk)}
		cfg := Config{Cell: name, Spaces: [2]Space{{Name: "real", Store: stores[0]}, {Name: "shadow", Stress: true, Store: stores[1]}},
			Owns: func(model.ShardID) bool { return owns },
			Check: func(sh model.ShardID) error {
				if owns {
					return nil
				}
				return model.Errorf(model.ErrWrongCell, "shard %d is not %s's", sh, name)
			},
			Enter: func() func() { return func() {} }, DBs: func() []int { return []int{0} }, Peers: peers{m}, Client: calls,
			Answers: answers{}, Tree: func() *activity.Tree { return tree }, Issued: func(string) int64 { return 0 },
			Clock: c.clk, Log: log}
		return New(cfg), stores
	}
	c.home, c.homeStores = keeper("cell-h", true)
	c.far, _ = keeper("cell-f", false)
	calls["h:1"] = c.home
	return c
}

// A cell that does not home a budget takes its leases from the home over
// the budget routes, in the space it spends for; what it gives back at
// drain returns to the home's row; the home lists them by holder.
func TestLeasesFromAnotherCell(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	c.home.Sync(c.home.cfg.Tree())
	id, err := c.far.Pool(1).Take(ctx, testKey, 100000, 300)
	if err != nil {
		t.Fatal(err)
	}
	sh := sharding.BudgetShard(testKey)
	b, leases, err := storage.Budget(ctx, c.homeStores[1], sh, testKey)
	if err != nil || len(leases) != 1 || leases[0].ID != id || leases[0].Holder != "cell-f" {
		t.Fatalf("the home's shadow row: %+v %+v, %v; want one lease %s of cell-f", b, leases, err, id)
	}
	if _, real, err := storage.Budget(ctx, c.homeStores[0], sh, testKey); err != nil || len(real) != 0 {
		t.Fatalf("the home's real row: %+v, %v; want no lease", real, err)
	}
	ls, err := c.far.leasesOf(ctx, c.far.cfg.Spaces[1], testKey, "cell-f")
	if err != nil || len(ls) != 1 || ls[0].ID != id || ls[0].State != model.LeaseOpen {
		t.Fatalf("listed at the home: %+v, %v; want lease %s open", ls, err, id)
	}
	c.far.returnAll()
	if b, _, err := storage.Budget(ctx, c.homeStores[1], sh, testKey); err != nil || b.Outstanding() != 300 {
		t.Fatalf("after the drain: %+v, %v; want the 300 spent out", b, err)
	}
}

// The home answers the budget routes' errors: a malformed key, a TTL out
// of range, a budget it does not home.
func TestServeRefuses(t *testing.T) {
	c := newCluster(t)
	serve := func(k *Keeper, route api.RouteID, body string) (int, error) {
		var rc fasthttp.RequestCtx
		rc.Request.SetBodyString(body)
		k.Serve(context.Background(), &rc, route, 0)
		err, _ := rc.UserValue("err").(error)
		return rc.Response.StatusCode(), err
	}
	for _, tc := range []struct {
		k     *Keeper
		route api.RouteID
		body  string
		want  error
	}{
		{c.home, api.RouteBudgetLease, `{"key":"bad key","holder":"cell-f","want":1,"ttl_ms":1000}`, model.ErrInvalidArgument},
		{c.home, api.RouteBudgetLease, `{"key":"` + testKey + `","holder":"cell-f","want":1,"ttl_ms":0}`, model.ErrInvalidArgument},
		{c.home, api.RouteBudgetLease, `{"key":"` + testKey + `","unknown":1}`, model.ErrInvalidArgument},
		{c.far, api.RouteBudgetReturn, `{"key":"` + testKey + `","lease_id":"x","unspent":0}`, model.ErrWrongCell},
		{c.far, api.RouteBudgetLeases, `{"key":"` + testKey + `","holder":"cell-f"}`, model.ErrWrongCell},
		{c.home, api.RouteCredits, `{}`, model.ErrNotFound},
	} {
		status, err := serve(tc.k, tc.route, tc.body)
		if !errors.Is(err, tc.want) || status < http.StatusBadRequest {
			t.Errorf("route %d %s: %d %v; want %v", tc.route, tc.body, status, err, tc.want)
		}
	}
	// A budget no file of the asking cell controls is not asked of its home.
	if _, err := c.far.Home(0).Grant(context.Background(), "fest/fest-official/snow", "cell-f", 1, 0, time.Minute); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("grant of an unknown scene: %v; want NOT_FOUND", err)
	}
}

// A lease its home marked expired SettleGrace ago is settled by what its
// holder's rows spent from it; a younger one is left alone.
func TestSettleExpired(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	if _, err := c.far.Home(0).Grant(ctx, testKey, "cell-f", 1000, 0, time.Minute); err != nil {
		t.Fatal(err)
	}
	c.clk.Advance(time.Minute)
	c.home.expireHomed(ctx)
	spent := func(string) (int64, error) { return 100, nil }
	c.far.SettleExpired(ctx, 0, testKey, "cell-f", spent)
	sh := sharding.BudgetShard(testKey)
	if b, _, err := storage.Budget(ctx, c.homeStores[0], sh, testKey); err != nil || b.Outstanding() != 1000 {
		t.Fatalf("settled before SettleGrace: %+v, %v", b, err)
	}
	c.clk.Advance(SettleGrace)
	c.far.SettleExpired(ctx, 0, testKey, "cell-f", spent)
	if b, _, err := storage.Budget(ctx, c.homeStores[0], sh, testKey); err != nil || b.Outstanding() != 100 {
		t.Fatalf("after settling: %+v, %v; want the 100 spent out", b, err)
	}
}
