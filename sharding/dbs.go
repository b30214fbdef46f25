package sharding

import "redcell/model"

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
