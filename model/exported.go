package model

// Exported is what a cell's retention export carried out of its tables into
// files (storage.ExportPass), as the audits count it: the rows and their
// money left the tables, their sums stay in the books. All amounts are cents.
//
// Flow sums are already inside the ledger's and the books' flow sums
// (Deposits, Sends, ...) and packet sums inside PacketTotals and its
// partners; what the audits need apart is the claims and credits, whose
// rows they match one by one above the Horizon and by sums below it.
type Exported struct {
	// Horizon is the claim date (YYYYMMDD, UTC, the first 8 characters of a
	// claim ID) below which claims and their credits may have been exported:
	// the highest an export reached in any database read. "" when none was.
	Horizon     string `json:"horizon,omitempty"`
	Packets     int64  `json:"packets"`         // packet rows exported
	PacketCents Cents  `json:"packet_cents"`    // their amounts
	Claims      int64  `json:"claims"`          // claim rows exported
	ClaimCents  Cents  `json:"claim_cents"`     // their amounts
	Credits     int64  `json:"credits"`         // credit flows exported
	CreditCents Cents  `json:"credit_cents"`    // their amounts
	Flows       int64  `json:"flows"`           // flow rows exported, credits among them
	FlowCents   Cents  `json:"flow_cents"`      // their signed sum: the balance they made
	Rewards     int64  `json:"rewards"`         // booked reward rows exported
	Coupons     int64  `json:"coupon_requests"` // refused coupon requests exported
}

// Add adds p to e; the Horizon is the later of the two.
func (e *Exported) Add(p Exported) {
	if p.Horizon > e.Horizon {
		e.Horizon = p.Horizon
	}
	e.Packets += p.Packets
	e.PacketCents += p.PacketCents
	e.Claims += p.Claims
	e.ClaimCents += p.ClaimCents
	e.Credits += p.Credits
	e.CreditCents += p.CreditCents
	e.Flows += p.Flows
	e.FlowCents += p.FlowCents
	e.Rewards += p.Rewards
	e.Coupons += p.Coupons
}

// BelowHorizon reports whether claim id is dated before horizon: its claim
// or its credit may have been exported, so the audits compare it by sums,
// not row by row. Nothing is below an empty horizon.
func BelowHorizon(id, horizon string) bool {
	return horizon != "" && len(id) >= 8 && id[:8] < horizon
}
