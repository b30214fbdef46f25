package wallet

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"redcell/api"
	"redcell/cell/activity"
	"redcell/cell/degrade"
	"redcell/internal/clock"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
	"redcell/storage/memstore"
)

type switches struct{}

func (switches) Off(degrade.Switch) bool { return false }

// booker is Booker: it counts the forced bookings asked for.
type booker struct{ calls int }

func (b *booker) BookPending(context.Context, int, model.ShardID, string) (int, error) {
	b.calls++
	return 0, nil
}

// newTeller is a Teller over two memstore spaces, whose withdrawals
// commit alone, releasing withdrawals to rel. Its handlers are called as
// Serve calls them (the cell's tests answer through Serve over HTTP).
func newTeller(t *testing.T, rel api.WithdrawRelease) (*Teller, *memstore.Store, *booker) {
	t.Helper()
	clk := clock.NewManual(time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC))
	stores := [2]*memstore.Store{memstore.New(clk), memstore.New(clk)}
	b := &booker{}
	tl := New(Config{Stores: [2]storage.Reader{stores[0], stores[1]},
		Account: func(actID string) (model.ShardID, error) {
			return sharding.ShardOfAct(actID), model.ValidateActID(actID)
		},
		Tree: func() *activity.Tree { return nil }, Booker: b, Release: rel, Switches: switches{}, Clock: clk,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Withdraw: func(ctx context.Context, space int, sh model.ShardID, actID, orderNo string, amount model.Cents) (model.Withdrawal, error) {
			op := &storage.WithdrawOp{Shard: sh, ActID: actID, OrderNo: orderNo, Amount: amount}
			if err := stores[space].CommitGroup(ctx, []storage.Op{op}); err != nil {
				return model.Withdrawal{}, err
			}
			return op.Withdrawal, op.Failed()
		}})
	return tl, stores[0], b
}

// withdraw is a withdrawal of 200 cents by u1 with order number w1 (body:
// another request).
func withdraw(tl *Teller, body string) (api.WithdrawResponse, error) {
	if body == "" {
		body = `{"order_no":"w1","amount":200}`
	}
	out, err := tl.withdraw(context.Background(), 0, "u1", []byte(body))
	w, _ := out.(api.WithdrawResponse)
	return w, err
}

// The gray release: the allow-list and the percent decide who withdraws;
// a withdrawal books the person's pending rewards first; its retry answers
// its first result after the release is taken back; anyone else is
// WITHDRAW_NOT_RELEASED.
func TestWithdrawRelease(t *testing.T) {
	tl, st, b := newTeller(t, api.WithdrawRelease{Percent: 0})
	if got := tl.WithdrawRelease(); got.Allow == nil || got.Percent != 0 {
		t.Fatalf("release at start: %+v, want an empty allow-list", got)
	}
	for _, bad := range []api.WithdrawRelease{{Percent: 101}, {Percent: -1}, {Allow: []string{"a b"}}} {
		if _, err := tl.SetWithdrawRelease(bad); !errors.Is(err, model.ErrInvalidArgument) {
			t.Errorf("SetWithdrawRelease(%+v): %v, want INVALID_ARGUMENT", bad, err)
		}
	}
	ctx := context.Background()
	sh := sharding.ShardOfAct("u1")
	if err := st.CommitGroup(ctx, []storage.Op{&storage.DepositOp{Shard: sh, ActID: "u1", OrderNo: "d1", Amount: 500}}); err != nil {
		t.Fatal(err)
	}
	if _, err := withdraw(tl, ""); !errors.Is(err, model.ErrWithdrawNotReleased) {
		t.Fatalf("not released: %v", err)
	}
	if _, err := tl.SetWithdrawRelease(api.WithdrawRelease{Allow: []string{"u1"}}); err != nil || !tl.released("u1") || tl.released("u2") {
		t.Fatalf("allow u1: %v", err)
	}
	if w, err := withdraw(tl, ""); err != nil || w.Balance != 300 || w.Repeat || b.calls != 1 {
		t.Fatalf("withdraw: %+v, %v (bookings asked %d)", w, err, b.calls)
	}
	if _, err := tl.SetWithdrawRelease(api.WithdrawRelease{}); err != nil {
		t.Fatal(err)
	}
	if w, err := withdraw(tl, ""); err != nil || !w.Repeat || w.Balance != 300 || b.calls != 1 {
		t.Fatalf("retry after the release was taken back: %+v, %v", w, err)
	}
	if _, err := withdraw(tl, `{"order_no":"w1","amount":201}`); !errors.Is(err, model.ErrOrderConflict) {
		t.Fatalf("retry with another amount: %v", err)
	}
	if _, err := tl.SetWithdrawRelease(api.WithdrawRelease{Percent: 100}); err != nil || !tl.released("anyone") {
		t.Fatalf("percent 100 releases everyone: %v", err)
	}
}

// The flow listing merges reward rows and flows newest first (a reward
// before a flow of the same millisecond when its order number sorts after
// the flow's item ID), and a full page carries the next page's cursor.
func TestMergeFlow(t *testing.T) {
	rs := []model.Reward{{OrderNo: "u1_rain_r2_cash_official", Scene: "rain", AwardType: "cash", Amount: 5, CreatedMS: 30},
		{OrderNo: "u1_card_r1_coupon_official", Scene: "card", AwardType: "coupon", Amount: 1, CreatedMS: 10}}
	fs := []model.Flow{{Seq: 7, Kind: model.FlowDeposit, Amount: 100, OrderNo: "d1", CreatedMS: 20},
		{Seq: 3, Kind: model.FlowCredit, Amount: 9, OrderNo: "claim:c1", CreatedMS: 10}}
	out := mergeFlow("u1", model.StageOfficial, 3, rs, fs)
	var kinds []string
	for _, it := range out.Items {
		kinds = append(kinds, it.Kind)
	}
	if want := []string{"reward", "deposit", "reward_coupon"}; len(kinds) != 3 || kinds[0] != want[0] || kinds[1] != want[1] || kinds[2] != want[2] {
		t.Fatalf("items %v, want %v", kinds, want)
	}
	if out.NextCursor == "" {
		t.Fatal("a full page has no cursor")
	}
	if all := mergeFlow("u1", model.StageOfficial, 10, rs, fs); len(all.Items) != 4 || all.NextCursor != "" || all.Items[3].Kind != "claim" {
		t.Fatalf("whole listing: %+v", all)
	}
}
