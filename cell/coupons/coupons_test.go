package coupons

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/cell/budget"
	"redcell/cell/couponq"
	"redcell/internal/clock"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
	"redcell/storage/memstore"
)

// answers is Answers as the cell's answer writer does it.
type answers struct{}

func (answers) JSON(rc *fasthttp.RequestCtx, status int, v any) {
	b, _ := json.Marshal(v)
	rc.SetStatusCode(status)
	rc.SetBody(b)
}

func (answers) Error(rc *fasthttp.RequestCtx, err error) { api.WriteError(rc, err) }

// homeBudgets is Budgets of a cell that homes every budget; no lease is
// granted (the tests here take none).
type homeBudgets struct{}

func (homeBudgets) Home(int) budget.Home { return nil }
func (homeBudgets) OwnerOf(model.ShardID) (string, error) {
	return "", model.Errorf(model.ErrCellUnavailable, "no other cell")
}
func (homeBudgets) HomeShard(key string) (model.ShardID, error) {
	if err := model.ValidateBudgetKey(key); err != nil {
		return 0, err
	}
	return sharding.BudgetShard(key), nil
}
func (homeBudgets) SettleExpired(context.Context, int, string, string, func(string) (int64, error)) {}

// newDrop is a drop of one cell serving every shard, over memstores, with
// one batch "b1" of 500 pieces.
func newDrop(t *testing.T) (*Drop, [2]*memstore.Store) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "coupons.yaml")
	if err := os.WriteFile(path, []byte("batches:\n  - {id: b1, stock: 500, face_value: 100, per_person_limit: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	clk := clock.NewManual(time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC))
	stores := [2]*memstore.Store{memstore.New(clk), memstore.New(clk)}
	all := func(model.ShardID) bool { return true }
	d, err := New(Config{Cell: "cell-a", Path: path, LeaseTTL: time.Minute,
		Spaces: [2]Space{{Name: "real", Store: stores[0], Coupons: stores[0]}, {Name: "shadow", Stress: true, Store: stores[1], Coupons: stores[1]}},
		Rates:  [2]int{100, 100}, QueueLen: 16, MergeMax: 8, StaleAfter: time.Minute,
		Own: Ownership{Owns: all, Check: func(model.ShardID) error { return nil }, DBs: func() []int { return []int{0} },
			ServesDB: func(int) bool { return true }, Enter: func() func() { return func() {} },
			Account: func(string) (model.ShardID, error) { return 0, nil }},
		Budgets: homeBudgets{}, Submit: func(context.Context, int, int, storage.MoneyOp) error { return errors.New("no committer") },
		Answers: answers{}, Reg: prometheus.NewRegistry(), Clock: clk, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return d, stores
}

// serve answers route with body in the real space.
func serve(d *Drop, route api.RouteID, body string) *fasthttp.RequestCtx {
	var rc fasthttp.RequestCtx
	rc.Request.SetBody([]byte(body))
	d.Serve(context.Background(), &rc, route, 0, "")
	return &rc
}

// A nil Drop is a cell without coupons: no stock, no keys, nothing settled.
func TestNilDrop(t *testing.T) {
	var d *Drop
	if n, ok := d.StockTotal(couponq.StockKey("b1")); ok || n != 0 {
		t.Fatalf("StockTotal of a nil Drop: %d, %v", n, ok)
	}
	if keys := d.StockKeys(); keys != nil {
		t.Fatalf("StockKeys of a nil Drop: %v", keys)
	}
	d.SettleLeases(context.Background())
}

// The batches file's stock is what the budgets make a stock row from; a
// deduction's lease outlives two coupon steps past a held lease's age.
func TestStockAndLeases(t *testing.T) {
	d, _ := newDrop(t)
	if n, ok := d.StockTotal(couponq.StockKey("b1")); !ok || n != 500 {
		t.Fatalf("StockTotal(b1) = %d, %v; want 500", n, ok)
	}
	if _, ok := d.StockTotal(couponq.StockKey("b2")); ok {
		t.Fatal("StockTotal of a batch the file lacks is known")
	}
	if _, ok := d.StockTotal("fest/x/y"); ok {
		t.Fatal("StockTotal of a scene's key is known")
	}
	if keys := d.StockKeys(); len(keys) != 1 || keys[0] != couponq.StockKey("b1") {
		t.Fatalf("StockKeys = %v", keys)
	}
	if got, want := d.LeaseTTL(), couponq.HeldMaxAge+2*couponq.StepTimeout; got != want {
		t.Fatalf("LeaseTTL = %s; want %s (the floor above Config.LeaseTTL's minute)", got, want)
	}
	if d.Holder() != "cell-a/coupons" {
		t.Fatalf("Holder = %q", d.Holder())
	}
}

// POST /internal/coupons/stock answers the batches with a stock row here,
// refuses more than stockMax batches, and another route is NOT_FOUND.
func TestStockRoute(t *testing.T) {
	d, stores := newDrop(t)
	d.syncStock(d.holder.Catalog())
	rc := serve(d, api.RouteCouponStock, `{"batches":["b1","b9"]}`)
	var out api.CouponStockResponse
	if err := json.Unmarshal(rc.Response.Body(), &out); err != nil || rc.Response.StatusCode() != 200 {
		t.Fatalf("stock: %d %s", rc.Response.StatusCode(), rc.Response.Body())
	}
	if len(out.Stock) != 1 || out.Stock[0] != (api.CouponStockLevel{Batch: "b1", Total: 500, Left: 500}) {
		t.Fatalf("stock = %+v; want b1 only, 500 left", out.Stock)
	}
	key := couponq.StockKey("b1")
	if b, _, err := storage.Budget(context.Background(), stores[1], sharding.BudgetShard(key), key); err != nil || b.Total != 500 {
		t.Fatalf("the shadow stock row: %+v, %v; want 500", b, err)
	}
	many := `{"batches":["b1"` + strings.Repeat(`,"b1"`, stockMax) + `]}`
	if rc := serve(d, api.RouteCouponStock, many); string(api.ErrorCode(rc.Response.Body())) != "INVALID_ARGUMENT" {
		t.Fatalf("%d batches: %d %s", stockMax+1, rc.Response.StatusCode(), rc.Response.Body())
	}
	if rc := serve(d, api.RouteBudgetLease, `{}`); string(api.ErrorCode(rc.Response.Body())) != "NOT_FOUND" {
		t.Fatalf("a budget route: %d %s", rc.Response.StatusCode(), rc.Response.Body())
	}
}

// The admin port's settings are checked before either engine changes.
func TestSetCoupons(t *testing.T) {
	d, _ := newDrop(t)
	bad := -1
	for _, set := range []api.CouponSetting{{MergeMax: 0}, {MergeMax: 1001}, {MergeMax: 4, Prefetch: &bad}} {
		if _, err := d.SetCoupons(set); !errors.Is(err, model.ErrInvalidArgument) {
			t.Fatalf("SetCoupons(%+v): %v; want INVALID_ARGUMENT", set, err)
		}
	}
	if d.engines[1].MergeMax() != 8 {
		t.Fatalf("a refused setting changed merge_max: %d", d.engines[1].MergeMax())
	}
	pre := 3
	out, err := d.SetCoupons(api.CouponSetting{MergeMax: 4, Prefetch: &pre})
	if err != nil || out.MergeMax != 4 || out.Prefetch != 3 || d.engines[1].MergeMax() != 4 || !out.Loaded || len(out.Batches) != 1 {
		t.Fatalf("SetCoupons: %+v, %v", out, err)
	}
}
