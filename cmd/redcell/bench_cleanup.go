package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"redcell/api"
)

// redcell bench --cleanup: drop the stress traffic's shadow databases on every
// cell of --config (POST /admin/shadow/cleanup on each admin port), after the
// runs, or alone when no other flag but --config is given.

// shadowCleanupTimeout bounds one cell's cleanup: the cell gives up on its
// own within 5 minutes (cell.shadowCleanupMax); a little more for the answer.
const shadowCleanupTimeout = 6 * time.Minute

// checkCleanup checks --cleanup: it needs --config (the cells' admin ports
// and token); with no other flag it runs alone (cleanupOnly).
func (f *benchFlags) checkCleanup() error {
	if f.configPath == "" {
		return errors.New("bench: --cleanup needs --config: the cells' admin_listen and the admin_token")
	}
	f.cleanupOnly = true
	for name := range f.set {
		if name != "cleanup" && name != "config" {
			f.cleanupOnly = false
		}
	}
	return nil
}

// cleanAfterBench drops the shadow space after the runs when they passed
// (runErr nil); a failed run keeps its rows to be looked at, and says how to
// drop them. It answers runErr, or the cleanup's error.
func cleanAfterBench(ctx context.Context, configPath string, runErr error) error {
	if runErr != nil {
		fmt.Fprintf(os.Stderr, "bench: the shadow tables are kept for a look at the failure; drop them with: redcell bench --cleanup --config %s\n", configPath)
		return runErr
	}
	return cleanShadowSpaces(ctx, configPath, os.Stdout)
}

// cleanShadowSpaces asks every cell of the config, all at once (each may
// first wait for its last stress traffic to be reconciled, 100 s by
// default), to drop its shadow databases, and prints what each dropped to w,
// in the config's order. A cell that fails (no admin port, down, an audit
// running) does not stop the others; the errors are joined.
func cleanShadowSpaces(ctx context.Context, configPath string, w io.Writer) error {
	fc, err := loadConfig(configPath)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "dropping the shadow databases of %d cells (each waits until its last stress traffic is reconciled, 100 s by default)\n", len(fc.Cells))
	type result struct {
		out api.ShadowCleanupResponse
		err error
	}
	results := make([]result, len(fc.Cells))
	var wg sync.WaitGroup
	for i, c := range fc.Cells {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, shadowCleanupTimeout)
			defer cancel()
			results[i].err = adminCall(cctx, fc, c, http.MethodPost, "/admin/shadow/cleanup", nil, &results[i].out)
		})
	}
	wg.Wait()
	var errs []error
	for i, c := range fc.Cells {
		out, err := results[i].out, results[i].err
		switch {
		case err != nil:
			fmt.Fprintf(w, "%s: shadow cleanup failed: %v\n", c.Name, err)
			errs = append(errs, err)
		case len(out.Databases) == 0:
			fmt.Fprintf(w, "%s: nothing to drop (no shadow database among its %d databases)\n", c.Name, out.Owned)
		default:
			fmt.Fprintf(w, "%s: dropped %d shadow databases of its %d, %d tables, in %s: %s\n", c.Name, len(out.Databases), out.Owned,
				out.Tables, time.Duration(out.TookMS)*time.Millisecond, shortList(out.Databases, 8))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("bench: shadow cleanup: %w", errors.Join(errs...))
	}
	return nil
}

// shortList joins names, the first most of them and a count of the rest.
func shortList(names []string, most int) string {
	s := ""
	for i, n := range names {
		if i == most {
			return s + fmt.Sprintf(" and %d more", len(names)-most)
		}
		if i > 0 {
			s += " "
		}
		s += n
	}
	return s
}
