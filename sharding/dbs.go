package sharding

import (
	"fmt"

	"redcell/model"
)

// CheckWholeDBs returns an error naming the first range of r that does not
// cover whole databases: a cell owns db_XX databases, ten shards each
// (model.ShardsPerDB), so a range begins at a multiple of ten and ends just
// before one ("0-499", "500-509"; not "0-4"). The database is what moves
// from cell to cell, with its shadow_db_XX, so ownership never splits one.
func (r Ranges) CheckWholeDBs() error {
	for _, x := range r {
		if int(x.From)%model.ShardsPerDB != 0 || (int(x.To)+1)%model.ShardsPerDB != 0 {
			return fmt.Errorf("sharding: shard range %s splits a database: ranges must cover whole databases of %d shards (e.g. %d-%d)",
				Ranges{x}, model.ShardsPerDB, int(x.From)/model.ShardsPerDB*model.ShardsPerDB, int(x.To)/model.ShardsPerDB*model.ShardsPerDB+model.ShardsPerDB-1)
		}
	}
	return nil
}

// RangesOfDBs is the ranges that cover the databases dbs (any order,
// duplicates ignored), whole and merged where adjacent: RangesOfDBs([]int{0,
// 1, 5}) is "0-19,50-59". Errors: a database outside 0..model.DBCount-1.
func RangesOfDBs(dbs []int) (Ranges, error) {
	var in [model.DBCount]bool
	for _, db := range dbs {
		if db < 0 || db >= model.DBCount {
			return nil, fmt.Errorf("sharding: no database %d (0..%d)", db, model.DBCount-1)
		}
		in[db] = true
	}
	var out Ranges
	for db := 0; db < model.DBCount; db++ {
		if !in[db] {
			continue
		}
		from := model.ShardID(db * model.ShardsPerDB)
		to := from + model.ShardsPerDB - 1
		if n := len(out); n > 0 && out[n-1].To+1 == from {
			out[n-1].To = to
			continue
		}
		out = append(out, Range{From: from, To: to})
	}
	return out, nil
}

// DBs lists the databases (db index) of the shards in r, each once, in the
// order of their first shard.
func (r Ranges) DBs() []int {
	var out []int
	seen := map[int]bool{}
	for _, sh := range r.Shards() {
		if db := sh.DB(); !seen[db] {
			seen[db] = true
			out = append(out, db)
		}
	}
	return out
}

// ShardsByDB lists the shards of r in each of their databases.
func (r Ranges) ShardsByDB() map[int][]model.ShardID {
	out := map[int][]model.ShardID{}
	for _, sh := range r.Shards() {
		out[sh.DB()] = append(out[sh.DB()], sh)
	}
	return out
}
