package storage

import (
	"database/sql"
	"fmt"
	"time"

	"redcell/internal/testenv"
)

// commitOnceWaitedFor commits tx, which holds a lock on table, once another
// connection's statement on table has run for 100 ms (MariaDB's PROCESSLIST:
// it waits for the lock; unlocked, it takes a few ms), so the waiter is sure
// to have met the lock however slow the machine. It waits up to 30 s, then
// commits anyway and says so; it answers on the returned channel.
func commitOnceWaitedFor(m *MySQL, tx *sql.Tx, table string) <-chan error {
	released := make(chan error, 1)
	go func() {
		waited := testenv.Until(30*time.Second, func() bool {
			var n int
			err := m.db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE ? AND TIME_MS >= 100",
				"%"+table+"%").Scan(&n)
			return err == nil && n > 0
		})
		err := tx.Commit()
		if err == nil && !waited {
			err = fmt.Errorf("no statement on %s waited for the lock within 30 s", table)
		}
		released <- err
	}()
	return released
}
