package api

// ShadowCleanupResponse answers POST /admin/shadow/cleanup on a cell's admin
// port: what the cell dropped of the stress traffic's shadow space. Asked
// again with nothing left, it answers no database and 0 tables.
type ShadowCleanupResponse struct {
	Cell string `json:"cell"`
	// Databases are the shadow databases dropped ("shadow_db_XX"), those of
	// the databases the cell owns that existed, in index order; empty when
	// none did.
	Databases []string `json:"databases"`
	Tables    int      `json:"tables"`  // the tables they held
	Owned     int      `json:"owned"`   // the databases the cell owns: the shadow ones it looked for
	TookMS    int64    `json:"took_ms"` // from the request to the answer, stress traffic held off meanwhile
	Reason    string   `json:"reason"`  // "admin" (this route) or "age" (shadow_retention)
	IdleMS    int64    `json:"idle_ms"` // how long the cell had seen no stress traffic when it began
}
