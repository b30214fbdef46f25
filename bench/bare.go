package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The bare open: the floor every open figure is read against. It is the open
// as the database alone does it, with no HTTP, no cell, no shards, no
// outbox and no credit: per transaction, on one packet table and one claim
// table, three statements for BarePackets packets (lock the packets with one
// SELECT ... FOR UPDATE, insert one claim each with one multi-row INSERT,
// write the packets back with one multi-row upsert), between START
// TRANSACTION and COMMIT. Each worker has its own packets, so no transaction
// waits for another's locks. It runs on the database server of the
// cluster's first cell, with that server's settings (durable commits
// included), in a database of its own (BareDatabase), made before the run
// and dropped after it; the work meter (WorkSources) counts it as it counts
// a workload's runs, so its statements, CPU µs and round trips per open sit
// beside theirs.

// BareDatabase is the bare open's own database on the server (the default
// of BareConfig.Database); RunBare drops and makes it again before each run
// and drops it after.
const BareDatabase = "redcell_bare"

// BarePackets is how many packets (one claim each) one bare transaction
// opens.
const BarePackets = 16

// bareShares is each bare packet's count of 1-cent shares: it never runs out.
const bareShares = 1 << 40

// BareConfig is one bare run.
type BareConfig struct {
	// DB is a connection pool to the server (no default database needed);
	// RunBare sets no limits on it but uses Workers connections at most.
	DB *sql.DB
	// Workers are the concurrent transactions (default 4).
	Workers int
	// Duration is how long the opens run (default 5 s; at most 5 min).
	Duration time.Duration
	// Database is the run's own database (default BareDatabase), dropped
	// and made again before the run and dropped after it.
	Database string
	// Work, when set, measures the run (WorkSources): the window starts
	// after the tables are made and ends once the servers are quiet.
	Work *WorkSources
}

// BareReport is what a bare run did and cost.
type BareReport struct {
	Workers      int     `json:"workers"`
	PacketsPerTx int     `json:"packets_per_tx"`
	Transactions int64   `json:"transactions"`
	Opens        int64   `json:"opens"` // claims inserted, each committed
	DurationMS   int64   `json:"duration_ms"`
	OpensPerSec  float64 `json:"opens_per_sec"`
	// StatementsPerTx is what each transaction sends: START TRANSACTION, the
	// three statements, COMMIT.
	StatementsPerTx int   `json:"statements_per_tx"`
	Work            *Work `json:"work,omitempty"`
}

// RunBare makes cfg.Database's tables, runs the bare open for cfg.Duration,
// checks the opens counted against the rows (bareCheck) and drops the
// database. Any statement failing ends the run with its error (the database
// is dropped all the same).
func RunBare(ctx context.Context, cfg BareConfig) (*BareReport, error) {
	if cfg.DB == nil {
		return nil, errors.New("bench: bare: no database")
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.Duration <= 0 {
		cfg.Duration = 5 * time.Second
	}
	if cfg.Database == "" {
		cfg.Database = BareDatabase
	}
	if cfg.Workers > 256 || cfg.Duration > 5*time.Minute || !bareName.MatchString(cfg.Database) {
		return nil, errors.New("bench: bare: workers must be 1..256, duration at most 5m and the database a name of 1..64 letters, digits and _")
	}
	db := cfg.Database
	defer func() { // also after a schema made in part
		drop, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_, _ = cfg.DB.ExecContext(drop, "DROP DATABASE IF EXISTS "+db)
	}()
	if err := bareSchema(ctx, cfg.DB, db, cfg.Workers*BarePackets); err != nil {
		return nil, err
	}
	var work0 workSnap
	if cfg.Work != nil {
		work0 = cfg.Work.begin(ctx)
	}
	// Transactions start until the duration is up and run to their end on
	// ctx (never cut by the duration): each COMMIT's outcome is known, so
	// the claims counted are the claims in the table (checked below).
	var txs atomic.Int64
	var stop atomic.Bool
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	for w := range cfg.Workers {
		wg.Go(func() {
			for n := 0; !stop.Load() && ctx.Err() == nil && time.Now().Before(deadline); n++ {
				if err := bareOpen(ctx, cfg.DB, db, w, n); err != nil {
					once.Do(func() { firstErr = err })
					stop.Store(true)
					return
				}
				txs.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	rep := &BareReport{Workers: cfg.Workers, PacketsPerTx: BarePackets, Transactions: txs.Load(), Opens: txs.Load() * BarePackets,
		DurationMS: elapsed.Milliseconds(), StatementsPerTx: 5}
	rep.OpensPerSec = float64(rep.Opens) / elapsed.Seconds()
	if cfg.Work != nil {
		rep.Work = cfg.Work.end(ctx, work0, rep.Opens, "bare open")
	}
	if firstErr != nil {
		return rep, fmt.Errorf("bench: bare: %w", firstErr)
	}
	if err := ctx.Err(); err != nil {
		return rep, err
	}
	return rep, bareCheck(ctx, cfg.DB, db, rep.Opens)
}

// bareCheck holds the run to its rows: as many claims as opens counted,
// each packet's remaining count and amount down by exactly its claims.
func bareCheck(ctx context.Context, db *sql.DB, name string, opens int64) error {
	var claims, cents, taken, takenCents int64
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM "+name+".t_claim").Scan(&claims, &cents); err != nil {
		return fmt.Errorf("bench: bare: count the claims: %w", err)
	}
	if err := db.QueryRowContext(ctx, "SELECT COALESCE(SUM(? - remaining_count), 0), COALESCE(SUM(? - remaining_amount), 0) FROM "+name+".t_packet",
		bareShares, bareShares).Scan(&taken, &takenCents); err != nil {
		return fmt.Errorf("bench: bare: read the packets: %w", err)
	}
	if claims != opens || cents != opens || taken != opens || takenCents != opens {
		return fmt.Errorf("bench: bare: %d opens counted, %d claims of %d cents in the table, the packets down %d shares and %d cents", opens, claims, cents, taken, takenCents)
	}
	return nil
}

// bareName is what a bare run's database may be called.
var bareName = regexp.MustCompile(`^[A-Za-z0-9_]{1,64}$`)

// bareSchema makes database name afresh with its two tables and n packets.
func bareSchema(ctx context.Context, db *sql.DB, name string, n int) error {
	stmts := []string{
		"DROP DATABASE IF EXISTS " + name,
		"CREATE DATABASE " + name,
		"CREATE TABLE " + name + ".t_packet (packet_id BIGINT NOT NULL PRIMARY KEY, remaining_amount BIGINT NOT NULL, " +
			"remaining_count BIGINT NOT NULL) ENGINE=InnoDB",
		"CREATE TABLE " + name + ".t_claim (packet_id BIGINT NOT NULL, seq BIGINT NOT NULL, act_id VARCHAR(64) NOT NULL, " +
			"amount BIGINT NOT NULL, created_ms BIGINT NOT NULL, PRIMARY KEY (packet_id, seq), UNIQUE KEY uk_claim (packet_id, act_id)) ENGINE=InnoDB",
	}
	for _, q := range stmts {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("bench: bare: %s: %w", q[:min(len(q), 40)], err)
		}
	}
	args := make([]any, 0, 3*n)
	for i := range n {
		args = append(args, i, bareShares, bareShares)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO "+name+".t_packet VALUES "+bareRows(n, 3), args...); err != nil {
		return fmt.Errorf("bench: bare: the packets: %w", err)
	}
	return nil
}

// bareOpen is one bare transaction: worker w's packets, the n-th time, one
// claim of 1 cent each by a new act_id.
func bareOpen(ctx context.Context, db *sql.DB, name string, w, n int) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }() // after COMMIT: sql.ErrTxDone
	ids := make([]any, BarePackets)
	for i := range ids {
		ids[i] = w*BarePackets + i
	}
	rows, err := tx.QueryContext(ctx, "SELECT packet_id, remaining_amount, remaining_count FROM "+name+".t_packet WHERE packet_id IN ("+
		strings.TrimSuffix(strings.Repeat("?,", BarePackets), ",")+") ORDER BY packet_id FOR UPDATE", ids...)
	if err != nil {
		return err
	}
	now := time.Now().UnixMilli()
	claims := make([]any, 0, 5*BarePackets)
	packets := make([]any, 0, 3*BarePackets)
	for rows.Next() {
		var id, amount, count int64
		if err := rows.Scan(&id, &amount, &count); err != nil {
			rows.Close()
			return err
		}
		seq := bareShares - count + 1
		claims = append(claims, id, seq, fmt.Sprintf("bare-%d-%d", w, n), 1, now)
		packets = append(packets, id, amount-1, count-1)
	}
	if err := rows.Close(); err != nil {
		return err
	}
	if len(packets) != 3*BarePackets {
		return fmt.Errorf("worker %d found %d of its %d packets", w, len(packets)/3, BarePackets)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+name+".t_claim VALUES "+bareRows(BarePackets, 5), claims...); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+name+".t_packet VALUES "+bareRows(BarePackets, 3)+
		" ON DUPLICATE KEY UPDATE remaining_amount = VALUES(remaining_amount), remaining_count = VALUES(remaining_count)", packets...); err != nil {
		return err
	}
	return tx.Commit()
}

// bareRows is "(?, ?), (?, ?)" for n rows of cols columns.
func bareRows(n, cols int) string {
	row := "(" + strings.TrimSuffix(strings.Repeat("?, ", cols), ", ") + ")"
	return strings.TrimSuffix(strings.Repeat(row+", ", n), ", ")
}

// namedWork is a run's name and what it cost (nil: not measured).
type namedWork struct {
	name string
	work *Work
}

// writeFloor is the bare run in a text report: its rate and cost per
// open, then each run's statements and MariaDB µs per operation divided by
// the bare open's (the rewards and coupons reports; report.md of the open
// workloads has the table of Suite.writeBare).
func (b *BareReport) writeFloor(ew *errWriter, indent string, runs []namedWork) {
	ew.printf("%sthe floor, the bare open (%d workers, %d packets a transaction): %.0f opens/s, %s statements and %s MariaDB µs per open\n",
		indent, b.Workers, b.PacketsPerTx, b.OpensPerSec, b.Work.statementsText(), b.Work.cpuText("mariadb"))
	for _, r := range runs {
		if r.work == nil {
			continue
		}
		ew.printf("%s  %s over the floor: statements %s×, MariaDB µs %s×\n", indent, r.name,
			overFloor(r.work.Statements, b.Work.statementsPtr()), overFloor(r.work.cpuPtr("mariadb"), b.Work.cpuPtr("mariadb")))
	}
}
