package bench

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"redcell/internal/testenv"
)

// bareDB is a pool to test server 1 with parameters interpolated, as the
// bench opens it (cmd/redcell bareConfig).
func bareDB(t *testing.T) *sql.DB {
	t.Helper()
	dc, err := mysql.ParseDSN(testenv.MySQLDSN(t, 1))
	if err != nil {
		t.Fatal(err)
	}
	dc.DBName, dc.InterpolateParams = "", true
	db, err := sql.Open("mysql", dc.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func schemaExists(t *testing.T, db *sql.DB, name string) bool {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// The bare open runs its transactions, counts 16 claims for each, finds
// them all in its table (RunBare checks the rows before it drops them) and
// leaves no database behind.
func TestBareRun(t *testing.T) {
	db := bareDB(t)
	name := testenv.Prefix() + "_bare"
	rep, err := RunBare(context.Background(), BareConfig{DB: db, Workers: 2, Duration: 300 * time.Millisecond, Database: name})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Transactions < 1 || rep.Opens != 16*rep.Transactions || rep.OpensPerSec <= 0 || rep.Work != nil || rep.StatementsPerTx != 5 {
		t.Errorf("report %+v", *rep)
	}
	if schemaExists(t, db, name) {
		t.Errorf("database %s left after the run", name)
	}
	if _, err := RunBare(context.Background(), BareConfig{DB: db, Database: "no-dashes"}); err == nil {
		t.Error("a database name with dashes was taken")
	}
}

// bareCheck refuses a count the rows do not bear out.
func TestBareCheck(t *testing.T) {
	db := bareDB(t)
	name := testenv.Prefix() + "_bare"
	ctx := context.Background()
	if err := bareSchema(ctx, db, name, 2*BarePackets); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec("DROP DATABASE IF EXISTS " + name) })
	for n := range 3 {
		if err := bareOpen(ctx, db, name, 1, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := bareCheck(ctx, db, name, 3*BarePackets); err != nil {
		t.Errorf("three transactions: %v", err)
	}
	if err := bareCheck(ctx, db, name, 3*BarePackets+1); err == nil || !strings.Contains(err.Error(), "49 opens counted, 48 claims") {
		t.Errorf("one open too many: %v", err)
	}
	// A claim of worker 0's packets taken by hand: the packet row no
	// longer matches its claims.
	if _, err := db.Exec("UPDATE " + name + ".t_packet SET remaining_count = remaining_count - 1 WHERE packet_id = 0"); err != nil {
		t.Fatal(err)
	}
	if err := bareCheck(ctx, db, name, 3*BarePackets); err == nil {
		t.Error("a packet down one share more than its claims passed")
	}
}
