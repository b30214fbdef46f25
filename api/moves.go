package api

// MoveStep is the body of POST /admin/moves on a cell's admin port: one step
// of moving database DB (db_XX with its shadow_db_XX) between cells, as the
// mover (redcell cells) drives it.
//   - "freeze": the cell answers 503 MOVING for DB's shards and waits until the
//     work that checked them before has finished (at most 5 s); it thaws by
//     itself after TTLMS (default 30,000) unless released, or, when the
//     shard map already gives DB to another cell under a higher version,
//     releases it.
//   - "thaw": the move is abandoned; the cell serves DB again.
//   - "release": the cell no longer owns DB; it saves its new ranges under
//     Version, announces them, and keeps its copy of DB (Digest, the content
//     the new owner verified) until the grace period ends.
//   - "adopt": the cell owns DB from now on, under Version, and announces it,
//     once its own copy of DB matches Digest, the content the mover verified
//     on both copies (storage.Digest.Sum); a copy that does not (an empty
//     one, say) is refused, 400 INVALID_ARGUMENT, and not served.
type MoveStep struct {
	Op      string `json:"op"`
	DB      int    `json:"db"`
	Version int64  `json:"version,omitempty"`
	TTLMS   int64  `json:"ttl_ms,omitempty"`
	Digest  string `json:"digest,omitempty"`
}

// MoveAnswer is the answer of POST /admin/moves: the cell's ownership after
// the step, and for a freeze how long the drain took (ms).
type MoveAnswer struct {
	Op        string `json:"op"`
	DB        int    `json:"db"`
	DrainedMS int64  `json:"drained_ms"`
	SavedMS   int64  `json:"saved_ms"`
	Shards    string `json:"shards"`
	Version   int64  `json:"version"`
}

// MovesState is the answer of GET /admin/moves: what the cell owns (Shards,
// Version, DBs), which of its databases are frozen by a move, and the
// databases it handed over and still holds a copy of.
type MovesState struct {
	Cell     string          `json:"cell"`
	Shards   string          `json:"shards"`
	Version  int64           `json:"version"`
	DBs      []int           `json:"dbs"`
	Frozen   []int           `json:"frozen"`
	MovedOut []MovedOutState `json:"moved_out"`
}

// MovedOutState is a database a cell handed over: when (Unix ms), under which
// map version, and when its copy is dropped (Unix ms).
type MovedOutState struct {
	DB         int   `json:"db"`
	Version    int64 `json:"version"`
	ReleasedMS int64 `json:"released_ms"`
	DropAtMS   int64 `json:"drop_at_ms"`
}

// CellsRequest is the body of POST /admin/cells on the router's admin port:
// one change of the cluster's cells, run in the background as redcell cells
// runs it (one database at a time, resumable from its state file).
//   - {"op":"add","name":"cell-3"}: move databases to cell-3 (in the config,
//     running, owning nothing) until every cell holds its share;
//   - {"op":"remove","name":"cell-3"}: move all of cell-3's databases to the
//     others;
//   - {"op":"move","db":34,"to":"cell-3"}: one database.
//
// Limit > 0 moves at most that many databases now.
type CellsRequest struct {
	Op    string `json:"op"`
	Name  string `json:"name,omitempty"`
	DB    int    `json:"db"`
	To    string `json:"to,omitempty"`
	Limit int    `json:"limit,omitempty"`
}

// CellsJob is the answer of GET and POST /admin/cells: the last change this
// router started and how far it got. State is "none" (never started),
// "running", "done" or "failed" (Error says why; the database being moved
// when it failed is served by its old owner as before). Lines are the
// progress lines, one per database, as redcell cells prints them (the last
// 200).
type CellsJob struct {
	State     string       `json:"state"`
	Request   CellsRequest `json:"request"`
	StartedMS int64        `json:"started_ms,omitempty"`
	EndedMS   int64        `json:"ended_ms,omitempty"`
	Lines     []string     `json:"lines"`
	Error     string       `json:"error,omitempty"`
}

// FailoverStep is POST /admin/failover on a cell's admin port. Op
// "switchback": a cell that serves from its promoted standby serves from its
// primary again, once the primary was rebuilt as the standby's
// semi-synchronous replica (redcell cells failback; storage.Failover
// SwitchBack).
type FailoverStep struct {
	Op string `json:"op"`
}

// FailoverAnswer is its answer: Serving is "primary" after a switch back;
// CaughtUpMS the primary catching up before the pause, PausedMS the pause
// (the cell's database calls refused, then DB_UNAVAILABLE), GTID the
// standby's binlog position the primary applied in it. StandbyError: the
// primary serves, but the old standby could not be made its replica.
type FailoverAnswer struct {
	Serving      string `json:"serving"`
	CaughtUpMS   int64  `json:"caught_up_ms"`
	PausedMS     int64  `json:"paused_ms"`
	GTID         string `json:"gtid"`
	StandbyError string `json:"standby_error,omitempty"`
}
