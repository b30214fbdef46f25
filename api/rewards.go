package api

// The reward wallet's bodies (docs/api.md, "Rewards and the wallet"). Amounts
// are int64: cents for cash, pieces for coupon kinds; times are Unix ms.

// RewardRequest is the body of POST /v1/rewards. The server builds the order
// number {act_id}_{scene_id}_{rain_id}_{award_type}_{stage} from it and the
// stage the request time picks, so a person gets at most one reward per
// scene, rain and stage, whatever the client retries.
type RewardRequest struct {
	ParentActivityID string `json:"parent_activity_id"`
	SceneID          string `json:"scene_id"`
	RainID           string `json:"rain_id"`
	ActID            string `json:"act_id"`
	AwardType        string `json:"award_type"`
	Amount           int64  `json:"amount"`
	// App names the calling app (recorded with the reward and in its token);
	// optional, 0..64 of [A-Za-z0-9_-].
	App string `json:"app,omitempty"`
	// Stage, when given, must be the stage the request time picks, else 409
	// NO_ACTIVE_STAGE: a retry or re-issue meant for one stage never lands
	// in the next one.
	Stage string `json:"stage,omitempty"`
	// BookNow books the reward before answering (status booked) instead of
	// behind: the synchronous path the bench compares token issuance with.
	BookNow bool `json:"book_now,omitempty"`
}

// RewardResponse answers POST /v1/rewards: the reward as issued (or as first
// issued, Repeat set), with its signed token (cell/rewardtoken).
type RewardResponse struct {
	OrderNo         string `json:"order_no"`
	Token           string `json:"token"`
	Amount          int64  `json:"amount"`
	AwardType       string `json:"award_type"`
	TemplateID      string `json:"template_id,omitempty"`
	Stage           string `json:"stage"`
	ChildActivityID string `json:"child_activity_id"`
	Status          string `json:"status"` // pending, processing or booked
	Repeat          bool   `json:"repeat"`
	CreatedMS       int64  `json:"created_ms"`
}

// RewardItem is one reward in GET /v1/accounts/{act_id}/rewards.
type RewardItem struct {
	OrderNo          string `json:"order_no"`
	ParentActivityID string `json:"parent_activity_id"`
	ChildActivityID  string `json:"child_activity_id"`
	Stage            string `json:"stage"`
	SceneID          string `json:"scene_id"`
	RainID           string `json:"rain_id"`
	AwardType        string `json:"award_type"`
	TemplateID       string `json:"template_id,omitempty"`
	Amount           int64  `json:"amount"`
	Status           string `json:"status"`
	CreatedMS        int64  `json:"created_ms"`
	BookedMS         int64  `json:"booked_ms,omitempty"`
}

// RewardsResponse answers GET /v1/accounts/{act_id}/rewards
// [?parent_activity_id=&stage=&cursor=&limit=]: newest first.
type RewardsResponse struct {
	ActID      string       `json:"act_id"`
	Rewards    []RewardItem `json:"rewards"`
	NextCursor string       `json:"next_cursor,omitempty"`
}

// StageWallet is one stage's money on the wallet page, cents.
type StageWallet struct {
	Stage string `json:"stage"`
	// Balance: for the official stage, the wallet's balance (rewards booked,
	// deposits, packets); for another stage, its booked cash rewards.
	Balance int64 `json:"balance"`
	// Pending: cash rewards issued and not booked yet.
	Pending int64 `json:"pending"`
	// CumulativeIncome: every cash reward of the stage, booked or pending.
	CumulativeIncome int64 `json:"cumulative_income"`
	Withdrawable     bool  `json:"withdrawable"` // only the official stage's money can be withdrawn
}

// WalletResponse answers GET /v1/accounts/{act_id}/wallet[?stage=]: the
// current stage's sums at the top, every stage in Stages.
type WalletResponse struct {
	ActID            string        `json:"act_id"`
	Stage            string        `json:"stage"`
	Balance          int64         `json:"balance"`
	Pending          int64         `json:"pending"`
	CumulativeIncome int64         `json:"cumulative_income"`
	Stages           []StageWallet `json:"stages"`
	// FlowDegraded: the wallet_flow degrade switch is off; the flow listing
	// answers 503 DEGRADED while the balance still answers.
	FlowDegraded bool `json:"flow_degraded,omitempty"`
}

// FlowItem is one entry of a person's flow listing.
type FlowItem struct {
	ID        string `json:"id"`   // the item's place (cursor), stable
	Kind      string `json:"kind"` // reward, withdraw, deposit, send, claim, refund
	Amount    int64  `json:"amount"`
	Status    string `json:"status"` // booked, or pending/processing for a reward not booked yet
	OrderNo   string `json:"order_no"`
	Ref       string `json:"ref,omitempty"` // the packet of a send, claim or refund; the scene of a reward
	Stage     string `json:"stage"`
	CreatedMS int64  `json:"created_ms"`
}

// FlowResponse answers GET /v1/accounts/{act_id}/flow[?stage=&cursor=&limit=].
type FlowResponse struct {
	ActID      string     `json:"act_id"`
	Stage      string     `json:"stage"`
	Items      []FlowItem `json:"items"`
	NextCursor string     `json:"next_cursor,omitempty"`
}

// WithdrawRequest is the body of POST /v1/accounts/{act_id}/withdraw.
type WithdrawRequest struct {
	Amount  int64  `json:"amount"`   // cents, > 0
	OrderNo string `json:"order_no"` // idempotency key, [A-Za-z0-9_-]{1,64}
	// Stage, when given, must be official: no other stage's money leaves.
	Stage string `json:"stage,omitempty"`
}

// WithdrawResponse answers a withdrawal: BookedNow counts the person's
// pending rewards booked first (forced booking).
type WithdrawResponse struct {
	ActID     string `json:"act_id"`
	OrderNo   string `json:"order_no"`
	Amount    int64  `json:"amount"`
	Balance   int64  `json:"balance"`
	Repeat    bool   `json:"repeat"`
	BookedNow int    `json:"booked_now"`
}

// TokensRequest is the body of POST /v1/accounts/{act_id}/tokens: the
// client's copies of its reward tokens, at most MaxTokens.
type TokensRequest struct {
	Tokens []string `json:"tokens"`
}

// MaxTokens bounds one TokensRequest.
const MaxTokens = 100

// TokenResult is what became of one token: Result is "known" (the cell has
// it; nothing changed), "restored" (valid, the cell had lost it: stored and
// booked now), or "refused" with Code (TOKEN_MALFORMED, TOKEN_UNKNOWN_KEY,
// TOKEN_BAD_SIGNATURE, TOKEN_RETIRED_KEY, TOKEN_EXPIRED, TOKEN_WRONG_ACCOUNT, TOKEN_WRONG_SPACE,
// TOKEN_MISMATCH).
type TokenResult struct {
	Index   int    `json:"index"`
	OrderNo string `json:"order_no,omitempty"`
	Result  string `json:"result"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
}

// TokensResponse answers POST /v1/accounts/{act_id}/tokens: 200 when no
// token was refused, else 422 with Error (TOKEN_REFUSED) set.
type TokensResponse struct {
	Error   *ErrorDetail  `json:"error,omitempty"`
	ActID   string        `json:"act_id"`
	Results []TokenResult `json:"results"`
}

// IssuedScene is one scene's "issued so far" in IssuedResponse.
type IssuedScene struct {
	SceneID   string `json:"scene_id"`
	AwardType string `json:"award_type"`
	Issued    int64  `json:"issued"` // cents for cash, pieces for coupon kinds
	Limit     int64  `json:"limit"`  // the budget or stock
}

// IssuedResponse answers GET /v1/activities/{parent_activity_id}/issued: the
// current child's scenes, from in-process counters flushed once a second
// to memcached and read back (cell/issued). StalenessMS bounds how old the
// cluster-wide part may be.
type IssuedResponse struct {
	ParentActivityID string        `json:"parent_activity_id"`
	ChildActivityID  string        `json:"child_activity_id"`
	Stage            string        `json:"stage"`
	Scenes           []IssuedScene `json:"scenes"`
	StalenessMS      int64         `json:"staleness_ms"`
}

// WithdrawRelease is the gray release of withdrawals (GET/PUT
// /admin/withdraw on a cell's admin port): an act_id may withdraw when it
// is in Allow, or when its hash falls in the first Percent of 100 buckets.
type WithdrawRelease struct {
	Percent int      `json:"percent" yaml:"percent"` // 0..100
	Allow   []string `json:"allow" yaml:"allow"`
}

// BudgetLeaseRequest is the body of POST /internal/budget/lease: a cell asks
// the home cell of budget Key for a lease of up to Want, holding back
// Reserve, for TTLMS ms. Total is the budget as the asking cell's activities
// file says, so a home that has no row yet makes it.
type BudgetLeaseRequest struct {
	Key     string `json:"key"`
	Holder  string `json:"holder"`
	Want    int64  `json:"want"`
	Reserve int64  `json:"reserve"`
	TTLMS   int64  `json:"ttl_ms"`
	Total   int64  `json:"total"`
}

// BudgetLease is a lease granted (the answer of /internal/budget/lease).
type BudgetLease struct {
	ID        string `json:"id"`
	Key       string `json:"key"`
	Holder    string `json:"holder"`
	Amount    int64  `json:"amount"`
	CreatedMS int64  `json:"created_ms"`
	ExpiresMS int64  `json:"expires_ms"`
}

// BudgetReturnRequest is the body of POST /internal/budget/return: the
// unspent part of a lease goes back to its budget, once.
type BudgetReturnRequest struct {
	Key     string `json:"key"`
	LeaseID string `json:"lease_id"`
	Unspent int64  `json:"unspent"`
}

// BudgetLeasesRequest is the body of POST /internal/budget/leases: the open
// and expired leases Holder holds of budget Key at its home, which a
// restarted holder settles (answered as BudgetLeasesResponse).
type BudgetLeasesRequest struct {
	Key    string `json:"key"`
	Holder string `json:"holder"`
}

// BudgetLeasesResponse lists leases (State "open" or "expired").
type BudgetLeasesResponse struct {
	Leases []BudgetLeaseState `json:"leases"`
}

// BudgetLeaseState is a lease with its state.
type BudgetLeaseState struct {
	BudgetLease
	State string `json:"state"`
}

// BookResponse answers POST /v1/accounts/{act_id}/book: the person's pending
// rewards booked now (forced booking), and the wallet's balance after.
type BookResponse struct {
	ActID     string `json:"act_id"`
	BookedNow int    `json:"booked_now"`
	Balance   int64  `json:"balance"`
}
