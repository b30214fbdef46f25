package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"redcell/cell"
	"redcell/cell/couponbatch"
	"redcell/internal/retry"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// runAudit reads every cell's rows and proves conservation; it exits non-zero
// (returns an error) and prints the difference when anything is off.
func runAudit(ctx context.Context, args []string) error { return audit(ctx, args, os.Stdout) }

// audit is runAudit printing its report to out.
func audit(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("audit", flag.ContinueOnError)
	path := fs.String("config", "deploy/local/redcell.yaml", "cluster config file (cells and their DSNs)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	settle := fs.Duration("settle", 10*time.Second, "how long to re-read while rows are still moving (credits in flight)")
	shadow := fs.Bool("shadow", false, "audit the shadow tables of stress traffic instead of real money")
	if err := fs.Parse(args); err != nil {
		return err
	}
	// Cells are read one after another, so a claim credited between two reads can
	// look off; re-read once a second for up to --settle before calling a
	// difference real. An error (a cell unreachable) ends it at once.
	var rep model.AuditReport
	var err error
	errMoving := errors.New("audit: rows still moving")
	_ = retry.Do(ctx, retry.Policy{Attempts: int(*settle/time.Second) + 1, Backoff: time.Second, Max: time.Second,
		Retryable: func(e error) bool { return e == errMoving }},
		func(int) error {
			rep, err = auditNamespace(ctx, *path, *shadow)
			if err == nil && !rep.OK() {
				return errMoving
			}
			return nil
		})
	if err != nil {
		return err
	}
	if rep.Copies == nil {
		rep.Copies = []model.DBCopy{}
	}
	if *asJSON {
		b, _ := json.MarshalIndent(rep, "", "  ")
		fmt.Fprintln(out, string(b))
	} else {
		printAudit(out, rep)
	}
	if !rep.OK() {
		return fmt.Errorf("audit FAILED: difference %d cents, %d problems", rep.Difference, len(rep.Problems))
	}
	return nil
}

func printAudit(w io.Writer, r model.AuditReport) {
	verdict := "OK"
	if !r.OK() {
		verdict = "FAILED"
	}
	fmt.Fprintf(w, "audit %s over cells %v\n", verdict, r.Cells)
	fmt.Fprintf(w, "  deposits        %14d cents\n", r.Deposits)
	fmt.Fprintf(w, "  rewards         %14d cents\n", r.Rewards)
	fmt.Fprintf(w, "  withdrawals     %14d cents\n", r.Withdrawals)
	fmt.Fprintf(w, "  balances        %14d cents\n", r.Balances)
	fmt.Fprintf(w, "  open packets    %14d cents (%d packets in all)\n", r.OpenRemaining, r.Packets)
	fmt.Fprintf(w, "  in flight       %14d cents (%d of %d claims not yet credited)\n", r.InFlight, r.InFlightCount, r.ClaimsCount)
	fmt.Fprintf(w, "  difference      %14d cents (deposits + rewards - withdrawals - balances - open - in flight)\n", r.Difference)
	rr := r.RewardRows
	fmt.Fprintf(w, "  reward rows     %14d (cash issued %d = booked %d + pending %d cents; booked into wallets %d)\n",
		rr.Count, rr.Issued, rr.Booked, rr.Pending, rr.IntoWall)
	for _, b := range rr.Budgets {
		fmt.Fprintf(w, "  budget %-40s total %d = issued %d + unissued %d (leases out %d)\n", b.Key, b.Total, b.Issued, b.Unissued, b.Outstanding)
	}
	cr := r.Coupons
	if len(cr.Requests) > 0 || len(cr.Batches) > 0 {
		fmt.Fprintf(w, "  coupon requests %14d issued, %d refused, %d open\n", cr.Requests["issued"], cr.Requests["refused"], cr.Open)
		for _, b := range cr.Batches {
			fmt.Fprintf(w, "  coupon batch %-34s stock %d = issued %d + left %d + written off %d\n", b.Batch, b.Stock, b.Issued, b.Left, b.WrittenOff)
		}
	}
	if x := r.Exported; x.Horizon != "" || x.Flows > 0 || x.Packets > 0 || x.Rewards > 0 || x.Coupons > 0 {
		fmt.Fprintf(w, "  exported        %14d packets (%d cents), %d claims (%d cents), %d flows (%d credits, %d cents), %d rewards, %d coupon requests; in the sums above\n",
			x.Packets, x.PacketCents, x.Claims, x.ClaimCents, x.Flows, x.Credits, x.CreditCents, x.Rewards, x.Coupons)
		if x.Horizon != "" {
			fmt.Fprintf(w, "  export horizon  %14s (latest; a claim or credit whose other side may have left is compared by sums)\n", x.Horizon)
		}
	}
	printCopies(w, r.Copies)
	for _, p := range r.Problems {
		fmt.Fprintf(w, "  PROBLEM: %s\n", p)
	}
}

// printCopies lists the copies not counted, one line each; those with no
// move record (leftovers a test server may hold by the dozen) in one line
// per cell.
func printCopies(w io.Writer, copies []model.DBCopy) {
	stray := map[string][]string{}
	var cells []string
	for _, c := range copies {
		if c.Kind != model.CopyUnrecorded || c.Owner == "" {
			fmt.Fprintf(w, "  copy, not counted: %s\n", c)
			continue
		}
		if stray[c.Cell] == nil {
			cells = append(cells, c.Cell)
		}
		stray[c.Cell] = append(stray[c.Cell], fmt.Sprintf("db_%02d (%s's)", c.DB, c.Owner))
	}
	for _, cell := range cells {
		fmt.Fprintf(w, "  copies, not counted: %s: %s, with no move record\n", cell, strings.Join(stray[cell], ", "))
	}
}

// auditNamespace reads every cell listed in the config and combines their
// ledgers. Each cell's books count the databases it owns by the cluster's
// shard map only (clusterOwners); every other database found on its server
// (a copy a move handed over, froze or is making, or one nobody recorded)
// is listed in the report's copies and never enters the sums.
func auditNamespace(ctx context.Context, configPath string, shadow bool) (model.AuditReport, error) {
	fc, err := loadConfig(configPath)
	if err != nil {
		return model.AuditReport{}, err
	}
	if len(fc.Cells) == 0 {
		return model.AuditReport{}, fmt.Errorf("audit: config %s lists no cells", configPath)
	}
	stores, closeStores, err := openCellDBs(fc, 2)
	if err != nil {
		return model.AuditReport{}, fmt.Errorf("audit: %w", err)
	}
	defer closeStores()
	owners, ties, err := clusterOwners(fc, func(i int) (string, int64, bool, error) { return stores[i].Ownership(ctx, fc.Cells[i].Name) })
	if err != nil {
		return model.AuditReport{}, err
	}
	ledgers := make([]model.Ledger, len(fc.Cells))
	copies := make([][]model.DBCopy, len(fc.Cells))
	errs := make([]error, len(fc.Cells))
	var wg sync.WaitGroup
	for i, c := range fc.Cells {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := stores[i]
			own := func(db int) bool { return owners[db] == c.Name }
			// A database another cell of the same server owns is that
			// cell's, not a copy.
			shared := func(db int) bool { return own(db) || ownedOnServer(fc, owners[db], c.DSN) }
			st.SetDBFilter(own)
			if shadow {
				st = st.Shadow()
			}
			if ledgers[i], errs[i] = st.Ledger(ctx, c.Name); errs[i] != nil {
				errs[i] = fmt.Errorf("audit: cell %s: %w", c.Name, errs[i])
				return
			}
			if copies[i], errs[i] = st.Copies(ctx, c.Name, shared); errs[i] != nil {
				errs[i] = fmt.Errorf("audit: cell %s: %w", c.Name, errs[i])
				return
			}
			for j := range copies[i] {
				copies[i][j].Owner = owners[copies[i][j].DB]
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return model.AuditReport{}, err
	}
	rep := model.Audit(ledgers)
	for _, cs := range copies {
		rep.AddCopies(cs)
	}
	rep.Problems = append(rep.Problems, ties...)
	limits, stale, err := couponAuditRules(fc)
	if err != nil {
		return rep, err
	}
	// A request deciding for two stale ages was dropped by the engine that
	// took it and not taken again: lost.
	rep.CheckCoupons(limits, time.Now().Add(-2*stale))
	return rep, nil
}

// clusterOwners is the cluster's shard map as the audit decides ownership:
// each cell of the config announces the ranges and map version it saved in
// its database after a move (redcell_meta.t_ownership, as the cell itself
// takes them at start; saved(i) reads those of fc.Cells[i]), or the
// config's when it saved none, and where two cells claim a database the
// higher version wins (sharding.NewMap, as every router decides). It
// returns the owner's name of each database ("" none), and a problem for
// each database two cells claim under one version: no version decides
// between them, so both may have served it (the map's tie-break by name
// would count one and list the other's copy as harmless).
func clusterOwners(fc fileConfig, saved func(i int) (ranges string, version int64, found bool, err error)) ([model.DBCount]string, []string, error) {
	var owners [model.DBCount]string
	version := cell.DefaultConfig().MapVersion
	if fc.Cell.MapVersion > 0 {
		version = fc.Cell.MapVersion
	}
	cells := make([]sharding.Cell, len(fc.Cells))
	for i, c := range fc.Cells {
		ranges, v, found, err := saved(i)
		if err != nil {
			return owners, nil, fmt.Errorf("audit: cell %s: %w", c.Name, err)
		}
		if !found {
			ranges, v = c.Shards, version
		}
		r := sharding.Ranges{}
		if strings.TrimSpace(ranges) != "" {
			if r, err = sharding.ParseRanges(ranges); err != nil {
				return owners, nil, fmt.Errorf("audit: cell %s: shards %q: %w", c.Name, ranges, err)
			}
		}
		cells[i] = sharding.Cell{Name: c.Name, Shards: r, Version: v}
	}
	m, _ := sharding.NewMap(cells)
	var ties []string
	for db := range owners {
		first := model.ShardID(db * model.ShardsPerDB)
		o, ok := m.Owner(first)
		if !ok {
			continue
		}
		owners[db] = o.Name
		for _, c := range cells {
			if c.Name != o.Name && c.Version == o.Version && c.Shards.Contains(first) {
				ties = append(ties, fmt.Sprintf("db_%02d is claimed by %s and %s under one map version %d: no version decides its owner, so both may have served it",
					db, o.Name, c.Name, o.Version))
			}
		}
	}
	return owners, ties, nil
}

// ownedOnServer reports whether cell name (not "") writes to the server dsn.
func ownedOnServer(fc fileConfig, name, dsn string) bool {
	for _, c := range fc.Cells {
		if name != "" && c.Name == name && c.DSN == dsn {
			return true
		}
	}
	return false
}

// couponAuditRules reads what the coupon audit needs of the config: each
// batch's per-person limit (from the batches file; none without one) and
// the age at which a deciding request is taken again.
func couponAuditRules(fc fileConfig) (map[string]int, time.Duration, error) {
	stale := cell.DefaultConfig().CouponStaleAfter
	if fc.Cell.CouponStaleAfter > 0 {
		stale = fc.Cell.CouponStaleAfter
	}
	limits := map[string]int{}
	if fc.Cell.Coupons == "" {
		return limits, stale, nil
	}
	cat, err := couponbatch.Load(fc.path(fc.Cell.Coupons), time.Now())
	if err != nil {
		return nil, 0, fmt.Errorf("audit: %w", err)
	}
	for _, b := range cat.Batches() {
		limits[b.ID] = b.PerPersonLimit
	}
	return limits, stale, nil
}

// openCellDBs opens the database of every cell of fc (openCellDB, conns
// connections each) and returns them in the order of fc.Cells, with a func
// that closes them all. Its error names the cell: "cell NAME: ..."; by then
// it has closed those it opened.
func openCellDBs(fc fileConfig, conns int) ([]*storage.MySQL, func(), error) {
	stores := make([]*storage.MySQL, len(fc.Cells))
	closeAll := func() {
		for _, st := range stores {
			if st != nil {
				st.Close()
			}
		}
	}
	for i, c := range fc.Cells {
		var err error
		if stores[i], err = openCellDB(c, conns); err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("cell %s: %w", c.Name, err)
		}
	}
	return stores, closeAll, nil
}

// openCellDB opens the database a cell of the config writes to: its
// primary, or its standby once that was promoted (a standby that replicates
// from nobody, storage.OpenFailover), so the audit and the bench read what
// the cell serves after a failover.
func openCellDB(c cellEntry, conns int) (*storage.MySQL, error) {
	if c.StandbyDSN == "" {
		return storage.Open(c.DSN, conns)
	}
	st, _, err := storage.OpenFailover(c.DSN, c.StandbyDSN, conns, slog.New(slog.NewTextHandler(io.Discard, nil)))
	return st, err
}
