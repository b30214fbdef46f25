package api

// CouponIssueRequest is the body of POST /v1/coupons/issue. SerialNo is the
// caller's idempotency key, unique per calling app (the app its API key
// names): a repeat answers the stored request, the same serial for another
// person or batch is 409 ORDER_CONFLICT. Green asks for the green channel:
// the request is decided in the call, ahead of the queues, and answered with
// its final state. DeviceID and ClientIP, as the calling app saw them, feed
// the built-in risk caps (per minute, per device, IP and act_id); both may be
// left out. ClientIP is an IPv4 or IPv6 address in canonical form.
type CouponIssueRequest struct {
	ActID    string `json:"act_id"`
	BatchID  string `json:"batch_id"`
	SerialNo string `json:"serial_no"`
	Green    bool   `json:"green,omitempty"`
	DeviceID string `json:"device_id,omitempty"`
	ClientIP string `json:"client_ip,omitempty"`
}

// CouponRequestState is a coupon request as stored: the answer of POST
// /v1/coupons/issue (202 while not final, 200 when final: on the green
// channel or a repeat) and of GET /v1/coupons/issue/{serial_no}?act_id=.
// State is accepted, deciding, issued or refused; Reason is set when
// refused (PER_PERSON_LIMIT, GROUP_HELD, RISK, SOLD_OUT, BATCH_CLOSED);
// CouponID when issued. Times are Unix ms; DecidedMS is 0 until final.
type CouponRequestState struct {
	SerialNo   string `json:"serial_no"`
	ActID      string `json:"act_id"`
	BatchID    string `json:"batch_id"`
	State      string `json:"state"`
	Reason     string `json:"reason,omitempty"`
	CouponID   string `json:"coupon_id,omitempty"`
	AcceptedMS int64  `json:"accepted_ms"`
	DecidedMS  int64  `json:"decided_ms,omitempty"`
	// Repeat is set on every answer of POST /v1/coupons/issue, false on
	// the one answer that stored the serial (202, or 200 on the green
	// channel) and true on every other; the state route leaves it out.
	Repeat *bool `json:"repeat,omitempty"`
}

// Coupon is one coupon a person holds: GET /v1/accounts/{act_id}/coupons.
// FaceValue is in cents, from the batch as loaded now (0 when the batch is no
// longer in the file); BatchGroup is "" for a batch in no group.
type Coupon struct {
	CouponID   string `json:"coupon_id"`
	BatchID    string `json:"batch_id"`
	BatchGroup string `json:"batch_group,omitempty"`
	FaceValue  int64  `json:"face_value"`
	SerialNo   string `json:"serial_no"`
	IssuedMS   int64  `json:"issued_ms"`
}

// CouponsResponse answers GET /v1/accounts/{act_id}/coupons[?cursor=&limit=]:
// the person's coupons, newest first, at most ?limit= (default and cap
// 100); NextCursor, when set, is the ?cursor= of the next page (none: this
// was the last).
type CouponsResponse struct {
	ActID      string   `json:"act_id"`
	Coupons    []Coupon `json:"coupons"`
	NextCursor string   `json:"next_cursor,omitempty"`
}

// CouponBatch is one batch of GET /admin/coupons: its file entry and, for a
// batch whose stock this cell homes, what is left and out now.
type CouponBatch struct {
	ID             string `json:"id"`
	Stock          int64  `json:"stock"`
	FaceValue      int64  `json:"face_value"`
	PerPersonLimit int    `json:"per_person_limit"`
	Group          string `json:"group,omitempty"`
	StartMS        int64  `json:"start_ms,omitempty"`
	EndMS          int64  `json:"end_ms,omitempty"`
	// Home is true on the cell that owns the batch's stock row; Left is the
	// stock nobody holds, Spent what issued coupons took, Out what open
	// deductions hold (all three only at the home).
	Home  bool  `json:"home"`
	Left  int64 `json:"left,omitempty"`
	Spent int64 `json:"spent,omitempty"`
	Out   int64 `json:"out,omitempty"`
}

// CouponSetting is the body of PUT /admin/coupons: MergeMax is the most
// queued requests of a batch one stock deduction takes (1..1000; 1 is a
// deduction per request), in both spaces, until the cell restarts.
type CouponSetting struct {
	MergeMax int `json:"merge_max"`
	// Prefetch, when set, is how many units beyond its own a merge's
	// deduction asks the batch's home for (0..10000; 0: a grant and a
	// return per merge); left out, it stays.
	Prefetch *int `json:"prefetch,omitempty"`
}

// CouponBatchesResponse answers GET /admin/coupons and POST
// /admin/coupons/reload.
type CouponBatchesResponse struct {
	Loaded   bool          `json:"loaded"`
	Path     string        `json:"path,omitempty"`
	Version  string        `json:"version,omitempty"`
	LoadedMS int64         `json:"loaded_at_ms,omitempty"`
	Batches  []CouponBatch `json:"batches"`
	// Engine counts since the cell started, and the queues now.
	Accepted int64 `json:"accepted"`
	Issued   int64 `json:"issued"`
	Refused  int64 `json:"refused"`
	Queue1   int   `json:"queue_layer1"`
	Queue2   int   `json:"queue_layer2"`
	MergeMax int   `json:"merge_max"`
	Prefetch int   `json:"prefetch"`
}

// CouponStockRequest is the body of POST /internal/coupons/stock: a cell
// asks the home cell of these batches' stock rows what is left, for its
// local copy of each batch's stock (refreshed every half second).
type CouponStockRequest struct {
	Batches []string `json:"batches"`
}

// CouponStockResponse answers CouponStockRequest: one entry per batch
// whose stock row the answering cell homes and has (the others are left
// out).
type CouponStockResponse struct {
	Stock []CouponStockLevel `json:"stock"`
}

// CouponStockLevel is a batch's stock at its home: Left, the units no
// deduction holds or spent; Held, the units open (or expired, unsettled)
// deductions hold, some of which may come back.
type CouponStockLevel struct {
	Batch string `json:"batch"`
	Total int64  `json:"total"`
	Left  int64  `json:"left"`
	Held  int64  `json:"held"`
}
