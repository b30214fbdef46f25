package cell

import (
	"log/slog"

	"redcell/internal/incident"
)

// incidents track the failures the cell's repeated work can run into, so that
// an outage is logged when it starts, in a summary at most every
// incident.DefaultEvery while it lasts, and when it ends, instead of once per
// attempt (a database down made the expiry scan and reconciliation log a line
// per database per pass). Per space where the work is: the real and the
// shadow tables have their own breakers and can fail apart.
//
// A pass over several databases calls OK once, after a pass in which none
// failed, so one database failing while the others answer is one incident,
// not a start and an end per pass. (The relay's trackers live with the relay.)
type incidents struct {
	expiryScan   [2]*incident.Tracker // ExpiredIn: which packets to refund
	refund       [2]*incident.Tracker // Refund of one expired packet
	reconWindow  [2]*incident.Tracker // ReconWindow of a database
	reconCredits [2]*incident.Tracker // CreditsOf this cell's own claimants
	reconAsk     [2]*incident.Set     // POST /internal/recon to another cell, per address
	outboxLag    [2]*incident.Tracker // OutboxLag for /metrics
	openBatch    [2]*incident.Tracker // an open transaction failing other than DB_UNAVAILABLE
	warmUp       *incident.Tracker    // the schema warm-up (real tables only)
	audit        *incident.Tracker    // the periodic audit of the cell's own books
	request      *incident.Tracker    // requests answered 5xx other than shedding and DB_UNAVAILABLE
}

// reconAskCellsMax bounds the per-cell trackers of reconciliation's calls to
// other cells: far above a cluster's cell count.
const reconAskCellsMax = 256

func newIncidents(log *slog.Logger) *incidents {
	in := &incidents{}
	every := incident.DefaultEvery
	for i, name := range [2]string{"real", "shadow"} {
		l := log.With("space", name)
		in.expiryScan[i] = incident.New(l, "expiry scan", every)
		in.refund[i] = incident.New(l, "expiry refund", every)
		in.reconWindow[i] = incident.New(l, "reconciliation window read", every)
		in.reconCredits[i] = incident.New(l, "reconciliation credit read", every)
		in.reconAsk[i] = incident.NewSet(l, "reconciliation credit check with a cell", "addr", every, reconAskCellsMax)
		in.outboxLag[i] = incident.New(l, "outbox lag read", every)
		in.openBatch[i] = incident.NewLines(l, incident.Lines{Start: "open batch failed", Still: "open batches still failing",
			End: "open batches commit again", Error: true}, every)
	}
	in.warmUp = incident.New(log, "schema warm-up", every)
	in.audit = incident.NewLines(log, incident.Lines{Start: "audit of the cell's books could not run",
		Still: "audit of the cell's books still cannot run", End: "audit of the cell's books runs again"}, every)
	in.request = incident.NewLines(log, incident.Lines{Start: "request failed", Still: "requests still failing",
		End: "requests answered again"}, every)
	return in
}

// spaceIndex is 0 for the real space, 1 for the shadow one.
func spaceIndex(sp *space) int {
	if sp.stress {
		return 1
	}
	return 0
}
