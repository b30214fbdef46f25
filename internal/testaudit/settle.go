package testaudit

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"

	"redcell/model"
	"redcell/storage"
)

// settlePage is how many claims Settle reads and checks at a time (a
// credit lookup takes at most 10,000).
const settlePage = 5000

// Settle moves the relay's saved position of every database, of every
// namespace and space on the servers dsns, past the claims already credited
// (in the same namespace and space, on any of the servers): claims a test
// cell left past its saved position when it stopped, credited but not yet
// known credited. A cell of another layout (another shard map over the same
// databases) would read them again after the position and deliver them to
// another cell, on the other server, and credit them twice. A position stops
// before the first claim credited nowhere (in created_ms order: just past
// the last claim credited before it, or at its millisecond when they share
// one), for the next relay to deliver it once; the claims credited after it
// are read again by that relay. A position never moves back. For the same
// reason it forgets the reconciliation positions (t_recon_position): a cell
// of another layout resuming from them would find those claims uncredited
// in their claimants' new cells and re-drive them there. It writes nothing
// else: a credit booked twice stays for the audit to find. It answers how
// many claims the relay positions moved past.
//
// Safe while cells run: the relay position it saves is one below which
// every claim is credited, which is what a relay saves; a running cell's
// reconciliation keeps its positions in memory and saves them again.
func Settle(ctx context.Context, dsns []string) (int, error) {
	prefixes, err := Namespaces(ctx, dsns)
	if err != nil {
		return 0, err
	}
	settled := 0
	for _, prefix := range prefixes {
		for _, shadow := range []bool{false, true} {
			n, err := settleSpace(ctx, dsns, prefix, shadow)
			settled += n
			if err != nil {
				return settled, fmt.Errorf("testaudit: settle %s: %w", Space{Prefix: prefix, Shadow: shadow}.Name(), err)
			}
		}
	}
	return settled, nil
}

// settleSpace settles the databases of one namespace and space on every
// server.
func settleSpace(ctx context.Context, dsns []string, prefix string, shadow bool) (int, error) {
	stores := make([]*storage.MySQL, len(dsns))
	for i, dsn := range dsns {
		real, err := open(dsn, prefix)
		if err != nil {
			return 0, err
		}
		defer real.Close() // both pools
		stores[i] = real
		if shadow {
			stores[i] = real.Shadow()
		}
	}
	dbs := make([]int, model.ShardCount/model.ShardsPerDB)
	for db := range dbs {
		dbs[db] = db
	}
	ns := prefix
	if shadow {
		ns += storage.ShadowPrefix
	}
	for _, dsn := range dsns {
		if err := forgetRecon(ctx, dsn, ns); err != nil {
			return 0, err
		}
	}
	settled := 0
	for _, st := range stores {
		saved, err := storage.RelayPositions(ctx, st, dbs)
		if err != nil {
			return settled, err
		}
		moved := map[int]int64{}
		for _, db := range dbs {
			pos, n, err := settleDB(ctx, st, stores, db, saved[db])
			if err != nil {
				return settled, err
			}
			if pos > saved[db] {
				moved[db] = pos
				settled += n
			}
		}
		if err := storage.SaveRelayPositions(ctx, st, moved); err != nil {
			return settled, err
		}
	}
	return settled, nil
}

// settleDB reads the claims of database db of st created at or after from,
// in created_ms order, and answers the position past those credited on any
// of the stores all (from when there are none) and how many it passed.
func settleDB(ctx context.Context, st *storage.MySQL, all []*storage.MySQL, db int, from int64) (int64, int, error) {
	pos, passed := from, 0
	lastMS, inLastMS := int64(-1), 0 // the last claim's creation time, and the claims passed in it
	after := model.ClaimPos{}
	now := time.Now().UnixMilli()
	for {
		page, next, err := storage.ClaimsAfter(ctx, st, db, from, after, now, settlePage)
		if err != nil || len(page) == 0 {
			return pos, passed, err
		}
		credited := map[string]bool{}
		for _, o := range all {
			found, err := storage.CreditsOf(ctx, o, page)
			if err != nil {
				return pos, passed, err
			}
			for id := range found {
				credited[id] = true
			}
		}
		for _, c := range page {
			if !credited[c.ClaimID] {
				// Credited nowhere: a relay delivers it. The position stays
				// just past the last claim credited, or at this one's
				// millisecond when they share it (those are not passed).
				if c.CreatedMS < pos {
					return c.CreatedMS, passed - inLastMS, nil
				}
				return pos, passed, nil
			}
			if c.CreatedMS != lastMS {
				lastMS, inLastMS = c.CreatedMS, 0
			}
			pos, passed, inLastMS = c.CreatedMS+1, passed+1, inLastMS+1
		}
		after = next
	}
}

// forgetRecon deletes the reconciliation positions of namespace and space ns
// (its database name prefix: the namespace's, then storage.ShadowPrefix for
// the shadow space) on the server at dsn.
func forgetRecon(ctx context.Context, dsn, ns string) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, "DELETE FROM `"+ns+"redcell_meta`.t_recon_position")
	var me *mysql.MySQLError
	if errors.As(err, &me) && (me.Number == 1146 || me.Number == 1049) { // never saved
		return nil
	}
	return err
}
