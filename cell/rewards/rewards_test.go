package rewards

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/cell/activity"
	"redcell/cell/budget"
	"redcell/cell/degrade"
	"redcell/cell/rewardtoken"
	"redcell/internal/clock"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
	"redcell/storage/memstore"
)

// One parent whose official child has two cash scenes of 100000 cents:
// rain, which the tests issue from, controls no stock (no lease:
// Budgets.Pool is never asked); gold does, so a reload checks it against
// what Budgets.Issued says it issued.
const tree = `
activities:
  - id: fest
    children:
      - id: fest-official
        stage: official
        start: 2027-01-31T20:00:00Z
        end: 2027-02-01T02:00:00Z
        rewards: [{id: r, scenes: [{id: rain, award_type: cash, amount: {min: 1, max: 888}, budget: 100000, rate_limit: {per_sec: 100, burst: 100}, pay_into: wallet}]},
                  {id: g, scenes: [{id: gold, award_type: cash, amount: {min: 1, max: 888}, budget: 100000, rate_limit: {per_sec: 100, burst: 100}, pay_into: wallet, control_stock: true}]}]
`

var start = time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC)

// budgets is Budgets for scenes that control no stock: it records the
// trees synced and answers issued for the reload's check.
type budgets struct {
	synced []*activity.Tree
	issued int64
}

func (b *budgets) Pool(int) *budget.Pool           { return nil }
func (b *budgets) SceneTotal(string) (int64, bool) { return 0, false }
func (b *budgets) Sync(t *activity.Tree)           { b.synced = append(b.synced, t) }
func (b *budgets) Issued(_, _, _ string) int64     { return b.issued }

type switches struct{}

func (switches) Off(degrade.Switch) bool { return false }

type noPeers struct{}

func (noPeers) Map() *sharding.Map { return nil }

// rig is an Issuer over two memstore spaces whose submits commit each op
// alone, as a group of one. Its handlers are called as Serve calls them
// (the cell's tests answer through Serve over HTTP).
type rig struct {
	i       *Issuer
	stores  [2]*memstore.Store
	budgets *budgets
	reg     *prometheus.Registry
}

func newRig(t *testing.T, keys string) rig {
	t.Helper()
	path := filepath.Join(t.TempDir(), "activities.yaml")
	if err := os.WriteFile(path, []byte(tree), 0o600); err != nil {
		t.Fatal(err)
	}
	clk := clock.NewManual(start)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	acts, err := LoadActivities(path, clk, log)
	if err != nil {
		t.Fatal(err)
	}
	ring, err := rewardtoken.LoadRing(keys)
	if err != nil {
		t.Fatal(err)
	}
	r := rig{stores: [2]*memstore.Store{memstore.New(clk), memstore.New(clk)}, budgets: &budgets{}, reg: prometheus.NewRegistry()}
	submit := func(ctx context.Context, space, _ int, op storage.MoneyOp) error {
		if err := r.stores[space].CommitGroup(ctx, []storage.Op{op}); err != nil {
			return err
		}
		return op.Failed()
	}
	r.i = New(Config{Activities: acts, Ring: ring,
		Spaces: [2]Space{{Name: "real", Store: r.stores[0]}, {Name: "shadow", Stress: true, Store: r.stores[1]}},
		Own: Ownership{Account: func(actID string) (model.ShardID, error) {
			return sharding.ShardOfAct(actID), model.ValidateActID(actID)
		},
			DBs: func() []int { return []int{0} }, ServesDB: func(int) bool { return true }, Enter: func() func() { return func() {} }},
		Budgets: r.budgets, Switches: switches{}, Peers: noPeers{}, Reg: r.reg, Clock: clk, Log: log,
		TokenTTL: time.Hour, CashMax: 20_000, BookingRate: 100, BookingBatch: 10, BookingInterval: time.Second, BookTimeout: 5 * time.Second,
		Submit: submit, SubmitTake: submit})
	return r
}

func keyFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys.yaml")
	if err := rewardtoken.NewKeyFile(path, "k1"); err != nil {
		t.Fatal(err)
	}
	return path
}

// tokens hands back tokens for actID: the answer's status and body.
func (r rig) tokens(t *testing.T, actID, body string) (int, api.TokensResponse, *fasthttp.RequestCtx) {
	t.Helper()
	var rc fasthttp.RequestCtx
	rc.Request.SetBodyString(body)
	status, out, err := r.i.tokens(context.Background(), &rc, 0, actID)
	if err != nil {
		t.Fatalf("tokens of %s: %v", actID, err)
	}
	return status, out.(api.TokensResponse), &rc
}

// An issue is stored pending with a token and counted; its repeat answers
// the first; forced booking books it into the wallet; its token is known
// where it is stored, and restored (stored again and booked) where it is
// not.
func TestIssueBookAndRestore(t *testing.T) {
	keys := keyFile(t)
	r := newRig(t, keys)
	ctx := context.Background()
	body := []byte(`{"act_id":"u1","parent_activity_id":"fest","scene_id":"rain","rain_id":"r1","award_type":"cash","amount":300}`)
	out, err := r.i.issue(ctx, 0, body)
	got, _ := out.(api.RewardResponse)
	if err != nil || got.Token == "" || got.Status != "pending" || got.Repeat || got.Stage != "official" {
		t.Fatalf("issue: %+v, %v", got, err)
	}
	if out, err := r.i.issue(ctx, 0, body); err != nil || !out.(api.RewardResponse).Repeat || out.(api.RewardResponse).OrderNo != got.OrderNo {
		t.Fatalf("repeat: %+v, %v", out, err)
	}
	out, err = r.i.issuedSoFar(0, "fest")
	issued, _ := out.(api.IssuedResponse)
	if err != nil || len(issued.Scenes) != 2 || issued.Scenes[0].SceneID != "rain" || issued.Scenes[0].Issued != 300 || issued.Scenes[0].Limit != 100000 {
		t.Fatalf("issued so far: %+v, %v", issued, err)
	}
	sh := sharding.ShardOfAct("u1")
	if n, err := r.i.BookPending(ctx, 0, sh, "u1"); n != 1 || err != nil {
		t.Fatalf("BookPending: %d, %v", n, err)
	}
	if a, err := storage.Account(ctx, r.stores[0], sh, "u1"); err != nil || a.Balance != 300 || r.i.Booked() != 1 {
		t.Fatalf("wallet after booking: %+v, %v; Booked %d", a, err, r.i.Booked())
	}
	tokens := `{"tokens":["` + got.Token + `"]}`
	if status, known, _ := r.tokens(t, "u1", tokens); status != 200 || len(known.Results) != 1 || known.Results[0].Result != "known" {
		t.Fatalf("tokens: %d %+v", status, known)
	}
	lost := newRig(t, keys) // the same keys, none of the rows
	if status, restored, _ := lost.tokens(t, "u1", tokens); status != 200 || len(restored.Results) != 1 || restored.Results[0].Result != "restored" {
		t.Fatalf("tokens where the reward was lost: %d %+v", status, restored)
	}
	if a, err := storage.Account(ctx, lost.stores[0], sh, "u1"); err != nil || a.Balance != 300 {
		t.Fatalf("wallet after the restore: %+v, %v", a, err)
	}
	status, refused, rc := lost.tokens(t, "u2", tokens)
	if status != 422 || refused.Results[0].Code != tokenWrongAccount || string(rc.Response.Header.Peek(api.HeaderCode)) != "TOKEN_REFUSED" {
		t.Fatalf("another person's token: %d %+v", status, refused)
	}
}

// A reload asks Budgets for what each scene issued, then syncs the budgets
// to the new tree; a file without activities answers NOT_FOUND on reload.
func TestReloadSyncsBudgets(t *testing.T) {
	r := newRig(t, keyFile(t))
	out, err := r.i.acts.ReloadActivities()
	if err != nil || !out.Loaded || len(out.Parents) != 1 || out.Parents[0].ID != "fest" {
		t.Fatalf("reload: %+v, %v", out, err)
	}
	if len(r.budgets.synced) != 1 || r.budgets.synced[0] != r.i.acts.Tree() {
		t.Fatalf("synced %d trees, want the reloaded one", len(r.budgets.synced))
	}
	r.budgets.issued = 100001 // more than gold's budget: the reload is refused
	if _, err := r.i.acts.ReloadActivities(); !errors.Is(err, model.ErrInvalidArgument) {
		t.Fatalf("reload below issued: %v, want INVALID_ARGUMENT", err)
	}
	none, err := LoadActivities("", nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil || none.Tree() != nil {
		t.Fatalf("no file: %v, %v", none.Tree(), err)
	}
	if _, err := none.ReloadActivities(); !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("reload without a file: %v, want NOT_FOUND", err)
	}
}

// The reward wallet's series keep their names, every space's from the
// start; the budget left is the scene's budget less what was issued.
func TestMetricNames(t *testing.T) {
	r := newRig(t, keyFile(t))
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
		if mf.GetName() == "redcell_reward_budget_left" {
			for _, m := range mf.GetMetric() {
				if m.GetGauge().GetValue() != 100000 {
					t.Errorf("budget left %v, want 100000", m)
				}
			}
		}
	}
	for _, want := range []string{"redcell_reward_issued_total", "redcell_reward_booked_total", "redcell_reward_booker_ticks_total",
		"redcell_reward_booking_lag_seconds", "redcell_reward_tokens_refused_total", "redcell_reward_tokens_restored_total",
		"redcell_reward_budget_left"} {
		if !slices.Contains(names, want) {
			t.Errorf("%s is not registered (have %v)", want, names)
		}
	}
}
