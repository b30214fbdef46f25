package cell

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/model"
)

// Reconciliation: near-real-time proof that claims turn into credits.
//
// Every ReconInterval, for each space and each owned database, the cell reads
// the claims created in the window [checked up to, now - ReconSettle) and the
// outbox rows of the same window, in one consistent read, and checks:
//
//  1. every claim has its outbox row with the same account and amount, and
//     every outbox row its claim (kinds outbox_missing, outbox_orphan,
//     outbox_mismatch);
//  2. an outbox row still pending at that age is lag, not a difference: it is
//     counted (redcell_recon_lagging_claims_total) and logged;
//  3. every delivered row is credited in the claimant's wallet with the same
//     account and amount (credit_missing, credit_mismatch): claimants of this
//     cell are looked up in its own flow tables, others by a signed
//     POST /internal/recon to the cell that owns them, 1,000 claims a call.
//
// Windows start when the cell starts; claims made before are covered by the
// hourly audit of the cell's own books and by `redcell audit`. A delivered
// claim whose claimant's cell cannot be asked is counted as unverified, and a
// claim still pending when its window was checked is not checked again: the
// audits cover both. Each pass reads at most reconWindowRows outbox rows per
// database and reconRowsPerPass in all; a window cut short goes on from where
// it stopped at the next pass (redcell_recon_checked_until_timestamp_seconds).

const (
	// reconWindowRows bounds the outbox rows one window read takes from one
	// database: above the largest open batch (4096 claims share one creation
	// time), small enough to hold in memory.
	reconWindowRows = 20_000
	// reconRowsPerPass bounds a whole pass of one space.
	reconRowsPerPass = 200_000
	// reconChunk is how many claims one credit lookup or /internal/recon call asks about.
	reconChunk = 1000
	// reconSamples is how many claim IDs a log line names per kind of difference.
	reconSamples = 5
)

// reconPass is what one reconciliation pass found in one space.
type reconPass struct {
	checked    model.Tally // claims whose outbox row agrees with them
	credited   model.Tally // delivered claims credited as claimed
	lagging    int64       // claims undelivered at ReconSettle's age
	unverified int64       // delivered claims whose claimant's cell could not be asked
	errors     int         // windows that could not be read (read again next pass)
	diffs      model.Diffs
}

// reconLoop runs reconciliation every ReconInterval until ctx ends.
func (s *Server) reconLoop(ctx context.Context) {
	start := s.now().UnixMilli()
	var cursors [2]map[int]int64 // per space: db -> checked up to (exclusive), Unix ms
	for i := range cursors {
		cursors[i] = map[int]int64{}
		for _, db := range s.ownedDBs() {
			cursors[i][db] = start
		}
	}
	for _, sp := range s.spaces { // "never yet" would read as a stall since 1970
		s.reconMetrics.of(sp).lastSuccess.Set(float64(start) / 1000)
	}
	every(ctx, s.cfg.ReconInterval, func(pass int) {
		for i, sp := range s.spaces {
			start := time.Now()
			p := s.reconOnce(ctx, sp, cursors[i], pass)
			if ctx.Err() == nil {
				s.reconMetrics.of(sp).passSeconds.Set(time.Since(start).Seconds())
				s.reportRecon(sp, p, cursors[i])
			}
		}
	})
}

// reconOnce checks the windows of every owned database of sp that have
// settled since the last pass, and advances cursors past what it read. Pass
// n starts at the n-th database, so that when the pass's row budget runs out
// it is not always the same databases that wait: a database is left for the
// next pass rather than read with less than a whole window's budget.
func (s *Server) reconOnce(ctx context.Context, sp *space, cursors map[int]int64, pass int) reconPass {
	p := reconPass{diffs: model.Diffs{}}
	to := s.now().Add(-s.cfg.ReconSettle).UnixMilli()
	budget := reconRowsPerPass
	shards := s.shardsByDB()
	var delivered []model.Credit
	dbs := s.ownedDBs()
	track := s.inc.reconWindow[spaceIndex(sp)]
	for k := range dbs {
		db := dbs[(k+pass)%len(dbs)]
		from := cursors[db]
		if from >= to || budget < reconWindowRows || ctx.Err() != nil {
			continue
		}
		w, err := sp.store.ReconWindow(ctx, db, shards[db], reconDays(from, to, s.cfg.PacketExpiry), from, to, reconWindowRows)
		if err != nil {
			p.errors++
			if ctx.Err() == nil {
				track.Fail(err, "db", db) // the window is read again at the next pass
			}
			continue
		}
		cursors[db] = w.ToMS
		ob := model.CompareOutbox(w.Claims, w.Outbox)
		budget -= int(ob.Outbox.Count)
		p.checked = p.checked.Plus(ob.Matched)
		p.lagging += int64(len(ob.Pending))
		p.diffs.Merge(ob.Diffs)
		delivered = append(delivered, ob.Delivered...)
	}
	if p.errors == 0 && ctx.Err() == nil {
		track.OK() // once per pass: one database failing while others answer stays one incident
	}
	s.reconCredits(ctx, sp, delivered, &p)
	return p
}

// reconCredits checks that each delivered claim is credited as claimed: in
// this cell's flow tables for its own claimants, through the owner's
// /internal/recon for the others.
func (s *Server) reconCredits(ctx context.Context, sp *space, delivered []model.Credit, p *reconPass) {
	var local []model.Credit
	remote := map[string][]model.Credit{}
	m := s.peers.Map()
	for _, c := range delivered {
		if s.Owns(c.Shard) {
			local = append(local, c)
			continue
		}
		owner, ok := m.Owner(c.Shard)
		if !ok {
			p.unverified++ // no live owner to ask now
			continue
		}
		remote[owner.Addr] = append(remote[owner.Addr], c)
	}
	add := func(cc model.CreditCheck) {
		p.credited = p.credited.Plus(cc.Matched)
		p.diffs.Merge(cc.Diffs)
	}
	localTrack := s.inc.reconCredits[spaceIndex(sp)]
	localFailed := false
	for start := 0; start < len(local) && ctx.Err() == nil; start += reconChunk {
		chunk := local[start:min(start+reconChunk, len(local))]
		found, err := sp.store.CreditsOf(ctx, chunk)
		if err != nil {
			p.unverified += int64(len(chunk))
			if ctx.Err() == nil {
				localFailed = true
				localTrack.Fail(err, "claims", len(chunk))
			}
			continue
		}
		add(model.CompareCredits(chunk, found))
	}
	if len(local) > 0 && !localFailed && ctx.Err() == nil {
		localTrack.OK()
	}
	addrs := make([]string, 0, len(remote))
	for a := range remote {
		addrs = append(addrs, a)
	}
	sort.Strings(addrs)
	for _, addr := range addrs {
		cs := remote[addr]
		track, failed := s.inc.reconAsk[spaceIndex(sp)].Of(addr), false
		for start := 0; start < len(cs) && ctx.Err() == nil; start += reconChunk {
			chunk := cs[start:min(start+reconChunk, len(cs))]
			cc, err := s.askRecon(ctx, sp, addr, chunk)
			if err != nil {
				p.unverified += int64(len(chunk))
				if ctx.Err() == nil {
					failed = true
					track.Fail(err, "claims", len(chunk))
				}
				continue
			}
			add(cc)
		}
		if !failed && ctx.Err() == nil {
			track.OK()
		}
	}
}

// askRecon posts claims to another cell's /internal/recon, signed like the
// relay's credits, and returns what it found.
func (s *Server) askRecon(ctx context.Context, sp *space, addr string, cs []model.Credit) (model.CreditCheck, error) {
	body, err := json.Marshal(api.ReconRequest{Credits: cs})
	if err != nil {
		return model.CreditCheck{}, err
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	const path = "/internal/recon"
	req.SetRequestURI("http://" + addr + path)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.SetBody(body)
	deadline := time.Now().Add(internalTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	req.Header.Set(api.HeaderDeadline, strconv.FormatInt(deadline.UnixMilli(), 10))
	if sp.stress {
		req.Header.Set(api.HeaderStress, "1")
	}
	s.signer.SignRequest(req, s.now()) // last: it covers the target, the stress flag and the body
	if err := sp.relay.client.DoDeadline(req, resp, deadline); err != nil {
		return model.CreditCheck{}, err
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return model.CreditCheck{}, fmt.Errorf("cell answered %d: %s", resp.StatusCode(), resp.Body())
	}
	var out api.ReconResponse
	if err := json.Unmarshal(resp.Body(), &out); err != nil {
		return model.CreditCheck{}, fmt.Errorf("cell answered %q: %w", resp.Body(), err)
	}
	cc := model.CreditCheck{Matched: model.Tally{Count: out.Matched, Cents: model.Cents(out.MatchedCents)}, Diffs: model.Diffs{}}
	if len(out.Missing) > 0 {
		cc.Diffs[model.DiffCreditMissing] = out.Missing
	}
	if len(out.Mismatched) > 0 {
		cc.Diffs[model.DiffCreditMismatch] = out.Mismatched
	}
	if n := cc.Matched.Count + int64(cc.Diffs.Count()); n != int64(len(cs)) {
		return model.CreditCheck{}, fmt.Errorf("cell accounted for %d of %d claims", n, len(cs))
	}
	return cc, nil
}

// reconHandler serves POST /internal/recon: which of the claims another cell
// delivered here are credited as claimed. serveRoute has checked its
// signature, as for every call; it reads only.
func (s *Server) reconHandler(ctx context.Context, rc *fasthttp.RequestCtx, sp *space) {
	credits, err := s.decodeCredits(rc.PostBody())
	if err != nil {
		s.writeErr(rc, err)
		return
	}
	found, err := sp.store.CreditsOf(ctx, credits)
	if err != nil {
		s.writeErr(rc, err)
		return
	}
	cc := model.CompareCredits(credits, found)
	s.writeJSON(rc, http.StatusOK, api.ReconResponse{Matched: cc.Matched.Count, MatchedCents: int64(cc.Matched.Cents),
		Missing: orEmpty(cc.Diffs[model.DiffCreditMissing]), Mismatched: orEmpty(cc.Diffs[model.DiffCreditMismatch])})
}

func orEmpty(ids []string) []string {
	if ids == nil {
		return []string{}
	}
	return ids
}

// reportRecon logs what a pass found and counts it in the metrics: each kind
// of difference at ERROR with its count and sample claim IDs, lag and
// unverified claims at WARN.
func (s *Server) reportRecon(sp *space, p reconPass, cursors map[int]int64) {
	m := s.reconMetrics.of(sp)
	m.checkedClaims.Add(float64(p.checked.Count))
	m.checkedCents.Add(float64(p.checked.Cents))
	m.creditedClaims.Add(float64(p.credited.Count))
	m.lagging.Add(float64(p.lagging))
	m.unverified.Add(float64(p.unverified))
	m.errors.Add(float64(p.errors))
	m.differences.Set(float64(p.diffs.Count()))
	for i, k := range model.DiffKinds {
		m.diffs[i].Add(float64(len(p.diffs[k])))
	}
	until := int64(0)
	for _, c := range cursors {
		if until == 0 || c < until {
			until = c
		}
	}
	m.checkedUntil.Set(float64(until) / 1000)
	if p.errors == 0 {
		m.lastSuccess.Set(float64(s.now().UnixMilli()) / 1000)
	}
	space := spaceName(sp)
	for _, k := range model.DiffKinds {
		if n := len(p.diffs[k]); n > 0 {
			s.log.Error("reconciliation found a difference", "space", space, "kind", k, "claims", n,
				"sample", p.diffs.Sample(k, reconSamples), "checked_claims", p.checked.Count, "checked_cents", p.checked.Cents,
				"credited_claims", p.credited.Count, "credited_cents", p.credited.Cents)
		}
	}
	if p.lagging > 0 {
		s.log.Warn("reconciliation: claims not delivered after the settle time", "space", space, "claims", p.lagging,
			"settle", s.cfg.ReconSettle, "relay_switch", s.Degraded().Relay)
	}
	if p.unverified > 0 {
		s.log.Warn("reconciliation: delivered claims whose credits could not be checked", "space", space, "claims", p.unverified)
	}
	if p.diffs.Count() == 0 && p.checked.Count > 0 {
		s.log.Debug("reconciliation clean", "space", space, "checked_claims", p.checked.Count, "checked_cents", p.checked.Cents,
			"credited_claims", p.credited.Count)
	}
}

// shardsByDB lists the owned shards of each owned database.
func (s *Server) shardsByDB() map[int][]model.ShardID {
	out := map[int][]model.ShardID{}
	for _, sh := range s.cfg.Shards.Shards() {
		out[sh.DB()] = append(out[sh.DB()], sh)
	}
	return out
}

// reconDays lists the days of month whose claim tables can hold claims
// created in [fromMS, toMS): a claim sits in its packet's creation day, and
// opens of a packet older than packetExpiry + 48 h make no claim (open.go).
func reconDays(fromMS, toMS int64, packetExpiry time.Duration) []int {
	start := time.UnixMilli(fromMS).UTC().Add(-packetExpiry - 48*time.Hour)
	end := time.UnixMilli(toMS).UTC()
	seen := map[int]bool{}
	var days []int
	for d := time.Date(start.Year(), start.Month(), start.Day(), 0, 0, 0, 0, time.UTC); !d.After(end) && len(days) < 31; d = d.AddDate(0, 0, 1) {
		if !seen[d.Day()] {
			seen[d.Day()] = true
			days = append(days, d.Day())
		}
	}
	return days
}

func spaceName(sp *space) string {
	if sp.stress {
		return "shadow"
	}
	return "real"
}

// reconMetrics are reconciliation's series, per space (label space: real, shadow).
type reconMetrics struct {
	spaces [2]*spaceReconMetrics // [0] real, [1] shadow, as Server.spaces
}

type spaceReconMetrics struct {
	diffs                                                                    [len(model.DiffKinds)]prometheus.Counter
	differences, lastSuccess, checkedUntil, passSeconds                      prometheus.Gauge
	checkedClaims, checkedCents, creditedClaims, lagging, unverified, errors prometheus.Counter
}

func newReconMetrics(reg prometheus.Registerer) *reconMetrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, append([]string{"space"}, labels...))
		reg.MustRegister(v)
		return v
	}
	gauge := func(name, help string) *prometheus.GaugeVec {
		v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"space"})
		reg.MustRegister(v)
		return v
	}
	diffs := counter("redcell_recon_differences_total", "Differences reconciliation found, by space and kind (outbox_missing, outbox_orphan, outbox_mismatch, credit_missing, credit_mismatch, credit_orphan).", "kind")
	differences := gauge("redcell_recon_differences", "Differences found by the last reconciliation pass (0: clean).")
	lastSuccess := gauge("redcell_recon_last_success_timestamp_seconds", "Unix time of the last reconciliation pass that read every window it meant to.")
	checkedUntil := gauge("redcell_recon_checked_until_timestamp_seconds", "Claims created before this Unix time have been reconciled (the oldest window end over the databases).")
	checkedClaims := counter("redcell_recon_checked_claims_total", "Claims reconciliation found matching their outbox rows.")
	checkedCents := counter("redcell_recon_checked_cents_total", "Cents of the claims reconciliation found matching their outbox rows.")
	credited := counter("redcell_recon_credited_claims_total", "Delivered claims reconciliation found credited as claimed.")
	lagging := counter("redcell_recon_lagging_claims_total", "Claims still undelivered when reconciliation checked them (lag, not a difference).")
	unverified := counter("redcell_recon_unverified_claims_total", "Delivered claims whose credits reconciliation could not check (claimant's cell unknown or unreachable).")
	errs := counter("redcell_recon_errors_total", "Reconciliation windows that could not be read (read again at the next pass).")
	passSeconds := gauge("redcell_recon_pass_seconds", "How long the last reconciliation pass took.")
	r := &reconMetrics{}
	for i, name := range [2]string{"real", "shadow"} {
		m := &spaceReconMetrics{
			differences: differences.WithLabelValues(name), lastSuccess: lastSuccess.WithLabelValues(name),
			checkedUntil: checkedUntil.WithLabelValues(name), checkedClaims: checkedClaims.WithLabelValues(name),
			checkedCents: checkedCents.WithLabelValues(name), creditedClaims: credited.WithLabelValues(name),
			lagging: lagging.WithLabelValues(name), unverified: unverified.WithLabelValues(name), errors: errs.WithLabelValues(name),
			passSeconds: passSeconds.WithLabelValues(name),
		}
		for k, kind := range model.DiffKinds {
			m.diffs[k] = diffs.WithLabelValues(name, kind)
		}
		r.spaces[i] = m
	}
	return r
}

func (r *reconMetrics) of(sp *space) *spaceReconMetrics {
	if sp.stress {
		return r.spaces[1]
	}
	return r.spaces[0]
}
