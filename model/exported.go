package model

// Exported is what a cell's retention export carried out of its tables into
// files (storage.ExportPass), as the audits count it: the rows and their
// money left the tables, their sums stay in the books. All amounts are cents.
//
// Flow sums are already inside the ledger's and the books' flow sums
// (Deposits, Sends, ...) and packet sums inside PacketTotals and its
// partners; what the audits need apart is the claims and credits: a claim
// found without its credit, or a credit without its claim, is compared by
// sums, not reported, where the missing row may have been exported (the
// horizons).
type Exported struct {
	// Horizon is the latest of the horizons below ("" none): what the
	// report shows.
	Horizon string `json:"horizon,omitempty"`
	// ClaimsHorizons: by database, the claim date (YYYYMMDD, UTC, the first
	// 8 characters of a claim ID) before which its claims may have been
	// exported (with their packets). CreditsHorizons: by database, the claim
	// date before which the credits booked into its wallets may have been.
	ClaimsHorizons  map[int]string `json:"claims_horizons,omitempty"`
	CreditsHorizons map[int]string `json:"credits_horizons,omitempty"`
	Packets         int64          `json:"packets"`         // packet rows exported
	PacketCents     Cents          `json:"packet_cents"`    // their amounts
	Claims          int64          `json:"claims"`          // claim rows exported
	ClaimCents      Cents          `json:"claim_cents"`     // their amounts
	Credits         int64          `json:"credits"`         // credit flows exported
	CreditCents     Cents          `json:"credit_cents"`    // their amounts
	Flows           int64          `json:"flows"`           // flow rows exported, credits among them
	FlowCents       Cents          `json:"flow_cents"`      // their signed sum: the balance they made
	Rewards         int64          `json:"rewards"`         // booked reward rows exported
	Coupons         int64          `json:"coupon_requests"` // refused coupon requests exported
}

// Add adds p to e; each horizon is the later of the two.
func (e *Exported) Add(p Exported) {
	for db, d := range p.ClaimsHorizons {
		e.SetHorizon(db, true, d)
	}
	for db, d := range p.CreditsHorizons {
		e.SetHorizon(db, false, d)
	}
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

// SetHorizon records that database db's claims (claims true) or credits
// were exported before date; the later date wins.
func (e *Exported) SetHorizon(db int, claims bool, date string) {
	m := &e.CreditsHorizons
	if claims {
		m = &e.ClaimsHorizons
	}
	if *m == nil {
		*m = map[int]string{}
	}
	if date > (*m)[db] {
		(*m)[db] = date
	}
	if date > e.Horizon {
		e.Horizon = date
	}
}

// ClaimMayBeExported reports whether the claim of claim ID id may have left
// its packet's database for an export file: dated before that database's
// claims horizon.
func (e Exported) ClaimMayBeExported(id string) bool {
	ref, _, err := ParseClaimID(id)
	return err == nil && BelowHorizon(id, e.ClaimsHorizons[ref.Shard.DB()])
}

// CreditMayBeExported reports whether the credit of claim ID id, booked
// into database claimantDB, may have left for an export file: the claim
// dated before that database's credits horizon.
func (e Exported) CreditMayBeExported(id string, claimantDB int) bool {
	return BelowHorizon(id, e.CreditsHorizons[claimantDB])
}

// BelowHorizon reports whether claim id is dated before horizon (YYYYMMDD).
// Nothing is below an empty horizon.
func BelowHorizon(id, horizon string) bool {
	return horizon != "" && len(id) >= 8 && id[:8] < horizon
}
