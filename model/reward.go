package model

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"sort"
	"strconv"
	"strings"

	"redcell/internal/invariant"
)

// Rewards: money (or coupon pieces) an activity gives a person, as Douyin's
// Spring Festival reward wallet issues them. A reward is issued at once, as a
// row in the person's home shard in state pending, and booked behind it:
// a cash reward of the official stage becomes a FlowReward flow in the
// person's wallet; a reward of another stage, or of a coupon kind, is booked
// by its state alone (its stage's balance is the sum of its booked rewards,
// never the wallet's, so stages never see each other's money).

// Reward flow kinds (model.FlowKind values in the flow table).
const (
	FlowReward   FlowKind = "reward"   // an official-stage cash reward booked into the wallet
	FlowWithdraw FlowKind = "withdraw" // money out of the wallet to the person's bank (Amount < 0)
)

// RewardStatus is where a reward is in its booking: pending → processing →
// booked. The values are stored (t_reward.status) and never change meaning.
type RewardStatus int8

const (
	RewardPending    RewardStatus = 0 // issued; the booker has not taken it
	RewardProcessing RewardStatus = 1 // a booker took it (ClaimedMS); a stale one is taken again
	RewardBooked     RewardStatus = 2 // in the wallet (official cash) or recorded as booked
)

func (s RewardStatus) String() string {
	switch s {
	case RewardPending:
		return "pending"
	case RewardProcessing:
		return "processing"
	case RewardBooked:
		return "booked"
	}
	return "unknown"
}

// AwardCash is the award type of cash rewards (Amount in cents); any other
// award type is a coupon kind (Amount in pieces, TemplateID set).
const AwardCash = "cash"

// StageOfficial is the one stage whose cash goes into the wallet and can be
// withdrawn (cell/activity.StageOfficial).
const StageOfficial = "official"

// RewardOrderNoMax bounds a reward's order number: a 64-character actID and
// four IDs of at most 32 characters, with their separators.
const RewardOrderNoMax = MaxIDLen + 4*33

// Reward is one issued reward, as its row holds it.
type Reward struct {
	OrderNo    string // RewardOrderNo of ActID, Scene, Rain, AwardType, Stage
	ActID      string
	Shard      ShardID // the actID's shard: the row's home
	App        string  // the calling app that issued it (its API key's app), "" when not known
	Parent     string  // the parent activity
	Child      string  // the child activity the issue time picked
	Stage      string  // the child's stage: test, gray or official
	Scene      string
	Rain       string
	AwardType  string // AwardCash or a coupon kind
	TemplateID string // coupon kinds: the coupon template
	Amount     Cents  // cents for cash, pieces for coupon kinds; > 0
	LeaseID    string // the budget lease it was spent from; "" when the scene controls no stock
	Token      string // the signed token answered to the caller (cell/rewardtoken)
	Status     RewardStatus
	CreatedMS  int64 // Unix ms of the issue
	ClaimedMS  int64 // when a booker took it (processing), 0 before
	BookedMS   int64 // when it was booked, 0 before
}

// Cash reports whether the reward pays cents (else coupon pieces).
func (r Reward) Cash() bool { return r.AwardType == AwardCash }

// IntoWallet reports whether booking r credits the wallet: official-stage
// cash. Other rewards are booked by their state alone.
func (r Reward) IntoWallet() bool { return r.Cash() && r.Stage == StageOfficial }

// RewardOrderNo is a reward's order number, built by the server:
// {actID}_{scene}_{rain}_{award_type}_{stage}. A person gets at most one
// reward per scene, rain and stage. Scene, rain, award type and stage never
// hold '_' (cell/activity.ValidateID), so the number parses from the right
// (ParseRewardOrderNo) even though an actID may hold '_'.
func RewardOrderNo(actID, scene, rain, awardType, stage string) string {
	return actID + "_" + scene + "_" + rain + "_" + awardType + "_" + stage
}

// ParseRewardOrderNo splits a reward order number from the right. Errors:
// ErrInvalidArgument when it has fewer than five parts or an empty one.
func ParseRewardOrderNo(s string) (actID, scene, rain, awardType, stage string, err error) {
	parts := make([]string, 4)
	rest := s
	for i := 3; i >= 0; i-- {
		j := strings.LastIndexByte(rest, '_')
		if j < 0 {
			return "", "", "", "", "", Invalidf("reward order number %q has too few parts", s)
		}
		parts[i], rest = rest[j+1:], rest[:j]
	}
	for _, p := range append(parts, rest) {
		if p == "" {
			return "", "", "", "", "", Invalidf("reward order number %q has an empty part", s)
		}
	}
	return rest, parts[0], parts[1], parts[2], parts[3], nil
}

// RewardFlowOrderNo is the order number of the flow that books an
// official-stage cash reward into the wallet: "reward:" and 32 hex digits of
// the SHA-256 of the reward's order number, which may be longer than the
// flow table's column. A reward is booked at most once.
func RewardFlowOrderNo(orderNo string) string {
	h := sha256.Sum256([]byte(orderNo))
	return "reward:" + hex.EncodeToString(h[:16])
}

// RewardHash fingerprints what must match when the same reward order number
// is issued again: the activity, the stage's child, the award and the amount.
// The same order number with another fingerprint is ErrOrderConflict.
func RewardHash(r Reward) string {
	return RequestHash(string(FlowReward), r.Parent, r.Child, r.AwardType, r.TemplateID, strconv.FormatInt(int64(r.Amount), 10))
}

// ReplayReward decides an issue whose order number has a reward already:
// nil when prior has the same fingerprint (the caller answers prior, with
// repeat set), else ErrOrderConflict.
func ReplayReward(prior, want Reward) error {
	if RewardHash(prior) != RewardHash(want) {
		return Errorf(ErrOrderConflict, "reward %s was issued with another activity, award or amount", prior.OrderNo)
	}
	return nil
}

// WithdrawHash is the fingerprint of a withdrawal of amount cents.
func WithdrawHash(amount Cents) string {
	return RequestHash(string(FlowWithdraw), strconv.FormatInt(int64(amount), 10))
}

// StageSums is one stage's reward money of one person, cents (cash rewards
// only): Booked + Pending = Income. Pending counts pending and processing.
type StageSums struct {
	Stage   string
	Booked  Cents
	Pending Cents
	Income  Cents
	// PendingCount counts the rewards of every award type not booked yet.
	PendingCount int64
}

// FlowCursor is a position in a person's flow listing, newest first: items
// strictly older than (CreatedMS, ID) come after it. The zero cursor is the
// start (newest).
type FlowCursor struct {
	CreatedMS int64
	ID        string
}

// Before reports whether an item at (ms, id) comes after c in the listing
// (is older): the listing's order is (created_ms, id) descending.
func (c FlowCursor) Before(ms int64, id string) bool {
	if c.CreatedMS == 0 && c.ID == "" {
		return true
	}
	return ms < c.CreatedMS || ms == c.CreatedMS && id < c.ID
}

// FlowSeqBelow says which flow rows at exactly c.CreatedMS come after c:
// those with Seq < the answer (FlowItemID orders as Seq does; an ID that is
// no flow's compares with all of them at once). math.MaxInt64 lets all of
// them through, 0 none.
func (c FlowCursor) FlowSeqBelow() int64 {
	if rest, ok := strings.CutPrefix(c.ID, "f:"); ok && len(rest) == 20 {
		if n, err := strconv.ParseInt(rest, 10, 64); err == nil {
			return n
		}
	}
	if c.ID > "f:99999999999999999999" {
		return math.MaxInt64
	}
	return 0
}

// String renders c for the API: "{created_ms}.{id}"; "" for the start.
func (c FlowCursor) String() string {
	if c.CreatedMS == 0 && c.ID == "" {
		return ""
	}
	return strconv.FormatInt(c.CreatedMS, 10) + "." + c.ID
}

// ParseFlowCursor reads a cursor String made. Errors: ErrInvalidArgument.
func ParseFlowCursor(s string) (FlowCursor, error) {
	if s == "" {
		return FlowCursor{}, nil
	}
	ms, id, ok := strings.Cut(s, ".")
	n, err := strconv.ParseInt(ms, 10, 64)
	if !ok || err != nil || n <= 0 || id == "" || len(id) > RewardOrderNoMax+8 {
		return FlowCursor{}, Invalidf("cursor %q is not one this API gave", s)
	}
	return FlowCursor{CreatedMS: n, ID: id}, nil
}

// Withdrawal is the result of a withdrawal: the wallet's balance right after it.
type Withdrawal struct {
	ActID   string `json:"act_id"`
	OrderNo string `json:"order_no"`
	Amount  Cents  `json:"amount"`
	Balance Cents  `json:"balance"`
	Repeat  bool   `json:"repeat"`
}

// WithdrawInput is what a withdrawal is decided on: the locked wallet's balance.
type WithdrawInput struct {
	ActID   string
	OrderNo string
	Amount  Cents // > 0, checked by the caller
	Balance Cents
	NowMS   int64
}

// WithdrawOutcome is what a withdrawal writes: its flow row (Amount < 0) and
// the answer.
type WithdrawOutcome struct {
	Withdrawal Withdrawal
	Flow       Flow
}

// ApplyWithdraw debits a withdrawal from a wallet. Errors:
// ErrInsufficientBalance when the balance is below the amount (nothing is
// written; the order number stays free).
//
// It asserts its preconditions (an amount of at least a cent, which the
// caller checks, and a balance not below zero) and its postconditions
// (checkWithdraw: the balance after is the balance before less the amount,
// never below zero, and the flow moves exactly that).
func ApplyWithdraw(in WithdrawInput) (WithdrawOutcome, error) {
	invariant.That(in.Amount >= 1, "withdrawal of an unchecked amount (WithdrawInput.Amount > 0 is the caller's check)")
	invariant.That(in.Balance >= 0, "negative balance before a withdrawal (no decision leaves a wallet below zero)")
	if in.Balance < in.Amount {
		return WithdrawOutcome{}, Errorf(ErrInsufficientBalance, "balance %d is below the withdrawal of %d", in.Balance, in.Amount)
	}
	after := in.Balance - in.Amount
	out := WithdrawOutcome{
		Withdrawal: Withdrawal{ActID: in.ActID, OrderNo: in.OrderNo, Amount: in.Amount, Balance: after},
		Flow: Flow{ActID: in.ActID, OrderNo: in.OrderNo, Kind: FlowWithdraw, Amount: -in.Amount, BalanceAfter: after,
			BalanceKnown: true, ReqHash: WithdrawHash(in.Amount), CreatedMS: in.NowMS},
	}
	checkWithdraw(in, out)
	return out, nil
}

// checkWithdraw asserts ApplyWithdraw's postconditions: balance after =
// balance before − amount, never below zero (ErrInsufficientBalance refuses
// the rest), and the flow and the answer both say so.
func checkWithdraw(in WithdrawInput, out WithdrawOutcome) {
	w, f := out.Withdrawal, out.Flow
	invariant.That(w.Balance >= 0 && w.Balance == in.Balance-in.Amount,
		"withdrawal must leave balance before − amount, never below zero (ApplyWithdraw)")
	invariant.That(f.Kind == FlowWithdraw && f.Amount == -in.Amount && f.BalanceAfter == w.Balance && f.BalanceKnown && w.Amount == in.Amount,
		"withdrawal flow must move exactly −amount to the balance answered (WithdrawOutcome)")
}

// RewardFlow is the flow that books r into the wallet (r.IntoWallet): the
// reward's cents under RewardFlowOrderNo, booked as "balance + Amount"
// without reading the balance, like a credit. ok is false for a reward that
// is booked by its state alone.
//
// It asserts that r is not booked yet (a reward is booked once: the bookers
// take only pending or processing rewards) and holds at least a cent or a
// piece, and that the flow credits exactly r.Amount (checkRewardFlow).
func RewardFlow(r Reward, nowMS int64) (f Flow, ok bool) {
	invariant.That(r.Status != RewardBooked, "a booked reward booked again (a reward is booked once: Reward.Status)")
	invariant.That(r.Amount >= 1, "reward of no amount (Reward.Amount > 0)")
	if !r.IntoWallet() {
		return Flow{}, false
	}
	f = Flow{ActID: r.ActID, OrderNo: RewardFlowOrderNo(r.OrderNo), Kind: FlowReward, Amount: r.Amount,
		Ref: r.Scene, CreatedMS: nowMS}
	checkRewardFlow(r, f)
	return f, true
}

// checkRewardFlow asserts RewardFlow's postcondition: the wallet gains
// exactly the reward's cents, in its owner's wallet, as a reward flow.
func checkRewardFlow(r Reward, f Flow) {
	invariant.That(f.Kind == FlowReward && f.Amount == r.Amount && f.ActID == r.ActID,
		"reward flow must credit exactly the reward's cents to its owner (RewardFlow)")
}

// SumRewards sums rewards by stage as the wallet page shows them
// (StageSums), sorted by stage name.
func SumRewards(rs []Reward) []StageSums {
	by := map[string]*StageSums{}
	var order []string
	for _, r := range rs {
		s := by[r.Stage]
		if s == nil {
			s = &StageSums{Stage: r.Stage}
			by[r.Stage] = s
			order = append(order, r.Stage)
		}
		if r.Status != RewardBooked {
			s.PendingCount++
		}
		if !r.Cash() {
			continue
		}
		s.Income += r.Amount
		if r.Status == RewardBooked {
			s.Booked += r.Amount
		} else {
			s.Pending += r.Amount
		}
	}
	sort.Strings(order)
	out := make([]StageSums, 0, len(order))
	for _, st := range order {
		out = append(out, *by[st])
	}
	return out
}
