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
// not a start and an end per pass. (The relay's, reconciliation's and the
// audit's, the budgets' and the rewards' trackers live with them.)
type incidents struct {
	expiryScan [2]*incident.Tracker // ExpiredIn: which packets to refund
	refund     [2]*incident.Tracker // Refund of one expired packet
	openBatch  [2]*incident.Tracker // an open transaction failing other than DB_UNAVAILABLE
	warmUp     *incident.Tracker    // the schema warm-up (real tables only)
	request    *incident.Tracker    // requests answered 5xx other than shedding and DB_UNAVAILABLE
}

func newIncidents(log *slog.Logger) *incidents {
	in := &incidents{}
	every := incident.DefaultEvery
	for i, name := range [2]string{"real", "shadow"} {
		l := log.With("space", name)
		in.expiryScan[i] = incident.New(l, "expiry scan", every)
		in.refund[i] = incident.New(l, "expiry refund", every)
		in.openBatch[i] = incident.NewLines(l, incident.Lines{Start: "open batch failed", Still: "open batches still failing",
			End: "open batches commit again", Error: true}, every)
	}
	in.warmUp = incident.New(log, "schema warm-up", every)
	in.request = incident.NewLines(log, incident.Lines{Start: "request failed", Still: "requests still failing",
		End: "requests answered again"}, every)
	return in
}
