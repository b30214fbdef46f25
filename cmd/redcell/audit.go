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
	"sync"
	"time"

	"redcell/cell"
	"redcell/cell/couponbatch"
	"redcell/internal/retry"
	"redcell/model"
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
	for _, p := range r.Problems {
		fmt.Fprintf(w, "  PROBLEM: %s\n", p)
	}
}

// auditShadow audits the shadow tables of stress traffic (the bench's audit).
func auditShadow(ctx context.Context, configPath string) (model.AuditReport, error) {
	return auditNamespace(ctx, configPath, true)
}

// auditNamespace reads every cell listed in the config and combines their ledgers.
func auditNamespace(ctx context.Context, configPath string, shadow bool) (model.AuditReport, error) {
	fc, err := loadConfig(configPath)
	if err != nil {
		return model.AuditReport{}, err
	}
	if len(fc.Cells) == 0 {
		return model.AuditReport{}, fmt.Errorf("audit: config %s lists no cells", configPath)
	}
	ledgers := make([]model.Ledger, len(fc.Cells))
	errs := make([]error, len(fc.Cells))
	var wg sync.WaitGroup
	for i, c := range fc.Cells {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := openCellDB(c, 2)
			if err != nil {
				errs[i] = err
				return
			}
			defer st.Close()
			// Not the copies of moves: one the cell handed over and keeps
			// until move_grace ends, or one a move is making on its server.
			skip, err := moveCopies(ctx, st, c.Name)
			if err != nil {
				errs[i] = fmt.Errorf("audit: cell %s: %w", c.Name, err)
				return
			}
			st.SetDBFilter(func(db int) bool { return !skip[db] })
			if shadow {
				st = st.Shadow()
			}
			ledgers[i], errs[i] = st.Ledger(ctx, c.Name)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("audit: cell %s: %w", c.Name, errs[i])
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return model.AuditReport{}, err
		}
	}
	rep := model.Audit(ledgers)
	limits, stale, err := couponAuditRules(fc)
	if err != nil {
		return rep, err
	}
	// A request deciding for two stale ages was dropped by the engine that
	// took it and not taken again: lost.
	rep.CheckCoupons(limits, time.Now().Add(-2*stale))
	return rep, nil
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

// moveCopies lists the databases on a cell's server that are copies of moves
// and not the cell's money: those it handed over and keeps until its
// move_grace ends (storage.MySQL.MovedOuts), and those a move's replication
// channel (move_db_XX) is copying onto it.
func moveCopies(ctx context.Context, st *storage.MySQL, cell string) (map[int]bool, error) {
	skip := map[int]bool{}
	mos, err := st.MovedOuts(ctx, cell)
	if err != nil {
		return nil, err
	}
	for _, mo := range mos {
		if mo.Digest != "" {
			skip[mo.DB] = true
		}
	}
	chans, err := st.MoveChannels(ctx)
	if err != nil {
		return nil, err
	}
	for _, db := range chans {
		skip[db] = true
	}
	return skip, nil
}
