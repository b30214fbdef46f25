// Package testaudit is the closing audit of the shared test servers: after a
// package's tests (Main) and after each make test pass (cmd/testaudit) it
// audits the money on both test MariaDB servers, every namespace of
// databases found there (storage.OpenPrefixed: "" and each test layout's
// prefix) in both spaces (real and shadow), the two servers' books of one
// namespace together, as `redcell audit` audits a cluster's cells
// (storage.MySQL.Ledger and model.Audit). Any difference or problem fails:
// a claim credited on both servers (a credit booked twice) can never hide
// behind what tests left there.
//
// Tests keep what they leave auditable: cells of different layouts share
// the unprefixed databases, and before a cell of another layout starts the
// servers are settled (Settle: each database's relay position moves past
// the latest claim credited on either server, so no later relay reads it
// again and books it a second time, and reconciliation positions are
// forgotten); tests that leave differences on purpose (planted faults,
// moves, dropped databases) use a private namespace they drop when they end.
// Legitimate leftovers pass: credits still in flight (a claim credited
// nowhere yet), packets left open.
package testaudit

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"redcell/model"
	"redcell/storage"
)

// Space is one namespace and space audited across the servers.
type Space struct {
	Prefix string            // the namespace's database name prefix ("" for the unprefixed databases)
	Shadow bool              // the stress space (prefix + "shadow_db_XX")
	Report model.AuditReport // model.Audit over the servers' ledgers, server 1's first
}

// Name says which databases s covers, e.g. "solo_db_XX" or "shadow_db_XX".
func (s Space) Name() string {
	if s.Shadow {
		return s.Prefix + storage.ShadowPrefix + "db_XX"
	}
	return s.Prefix + "db_XX"
}

// schemaName parses a database name of redcell's: its namespace and space.
var schemaName = regexp.MustCompile(`^([a-z0-9]+_)?(shadow_)?db_[0-9]{2}$`)

// Namespaces lists the database name prefixes that hold redcell databases
// (either space) on the servers dsns, sorted.
func Namespaces(ctx context.Context, dsns []string) ([]string, error) {
	seen := map[string]bool{}
	for _, dsn := range dsns {
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			return nil, err
		}
		rows, err := db.QueryContext(ctx, "SELECT SCHEMA_NAME FROM information_schema.SCHEMATA")
		if err != nil {
			db.Close()
			return nil, fmt.Errorf("testaudit: list databases: %w", err)
		}
		for rows.Next() {
			var name string
			if err := rows.Scan(&name); err != nil {
				rows.Close()
				db.Close()
				return nil, err
			}
			if m := schemaName.FindStringSubmatch(name); m != nil && m[1] != storage.ShadowPrefix {
				seen[m[1]] = true
			}
		}
		err = rows.Err()
		rows.Close()
		db.Close()
		if err != nil {
			return nil, err
		}
	}
	out := make([]string, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	sort.Strings(out)
	return out, nil
}

// Audit audits namespace prefix, space shadow, over the servers dsns: each
// server's ledger (named "server-N") read by the store, combined by
// model.Audit.
func Audit(ctx context.Context, dsns []string, prefix string, shadow bool) (Space, error) {
	ledgers := make([]model.Ledger, 0, len(dsns))
	for i, dsn := range dsns {
		real, err := open(dsn, prefix)
		if err != nil {
			return Space{}, err
		}
		st := real
		if shadow {
			st = real.Shadow()
		}
		l, err := st.Ledger(ctx, fmt.Sprintf("server-%d", i+1))
		real.Close() // both pools
		if err != nil {
			return Space{}, fmt.Errorf("testaudit: %sdb_XX on server %d: %w", prefix, i+1, err)
		}
		ledgers = append(ledgers, l)
	}
	return Space{Prefix: prefix, Shadow: shadow, Report: model.Audit(ledgers)}, nil
}

func open(dsn, prefix string) (*storage.MySQL, error) {
	if prefix == "" {
		return storage.Open(dsn, 2)
	}
	return storage.OpenPrefixed(dsn, 2, prefix)
}

// Servers audits every namespace found on the servers dsns, both spaces of
// each. It answers every space audited; err joins one error per space that
// is not clean (a difference or a problem) or could not be read.
func Servers(ctx context.Context, dsns []string) ([]Space, error) {
	prefixes, err := Namespaces(ctx, dsns)
	if err != nil {
		return nil, err
	}
	var out []Space
	var errs []error
	for _, p := range prefixes {
		for _, shadow := range []bool{false, true} {
			s, err := Audit(ctx, dsns, p, shadow)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			out = append(out, s)
			if !s.Report.OK() {
				errs = append(errs, fmt.Errorf("%s: difference %d cents, %d problems:\n    %s", s.Name(), s.Report.Difference,
					len(s.Report.Problems), strings.Join(s.Report.Problems, "\n    ")))
			}
		}
	}
	return out, errors.Join(errs...)
}

// TestServers are the DSNs of the two test servers (deploy/local/testenv.sh),
// or nil when they are not set.
func TestServers() []string {
	d1, d2 := os.Getenv("REDCELL_TEST_MYSQL_DSN_1"), os.Getenv("REDCELL_TEST_MYSQL_DSN_2")
	if d1 == "" || d2 == "" {
		return nil
	}
	return []string{d1, d2}
}

// Summary is one line per space audited.
func Summary(spaces []Space) string {
	var b strings.Builder
	for _, s := range spaces {
		r := s.Report
		verdict := "OK"
		if !r.OK() {
			verdict = "FAILED"
		}
		fmt.Fprintf(&b, "  %-22s %-6s %d claims (%d in flight), %d packets, balances %d cents\n", s.Name(), verdict, r.ClaimsCount, r.InFlightCount, r.Packets, r.Balances)
	}
	return b.String()
}

// timeout bounds the closing audit: it reads every money row of both servers.
const timeout = 5 * time.Minute

// Check runs the closing audit over the test servers and answers a report
// and whether it passed; with no test servers set it passes with a note
// (the packages' tests fail in CI without them).
func Check(who string) (report string, ok bool) {
	dsns := TestServers()
	if dsns == nil {
		// In CI the servers are always there (make test starts them): a
		// closing audit that cannot run there is a failure, not a skip.
		if os.Getenv("CI") != "" {
			return who + ": closing audit FAILED: no test servers (REDCELL_TEST_MYSQL_DSN_1/_2) under CI\n", false
		}
		return who + ": closing audit skipped: no test servers (REDCELL_TEST_MYSQL_DSN_1/_2)\n", true
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	spaces, err := Servers(ctx, dsns)
	head := fmt.Sprintf("%s: closing audit of both test servers, %d namespaces and spaces, %s", who, len(spaces), time.Since(start).Round(time.Millisecond))
	if err != nil {
		return fmt.Sprintf("%s: FAILED\n%s%v\n", head, Summary(spaces), err), false
	}
	return head + ": OK\n", true
}

// Main runs a package's tests (m.Run) and then the closing audit: a package
// whose tests passed fails when the audit does. A package that runs cells or
// writes money rows on the shared test servers calls it from its TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(testaudit.Main(m, "cell")) }
func Main(m *testing.M, pkg string) int {
	code := m.Run()
	report, ok := Check(pkg)
	fmt.Print(report)
	if !ok && code == 0 {
		code = 1
	}
	return code
}
