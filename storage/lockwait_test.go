package storage

import (
	"database/sql"
	"fmt"
	"time"

	"redcell/internal/testenv"
)

// lockWaitedOn reports whether, within 30 s, a statement on table runs for
// 100 ms or more (MariaDB's PROCESSLIST): one that waits for a lock, as
// unlocked it takes a few ms. A test sees through it that a transaction met a
// lock the test holds, however slow the machine.
func lockWaitedOn(m *MySQL, table string) bool {
	return testenv.Until(30*time.Second, func() bool {
		var n int
		err := m.db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE ? AND TIME_MS >= 100",
			"%"+table+"%").Scan(&n)
		return err == nil && n > 0
	})
}

// commitOnceWaitedFor commits tx, which holds a lock on table, once another
// transaction's statement waits for it (lockWaitedOn); after 30 s without
// one it commits anyway and says so. It answers on the returned channel.
func commitOnceWaitedFor(m *MySQL, tx *sql.Tx, table string) <-chan error {
	released := make(chan error, 1)
	go func() {
		waited := lockWaitedOn(m, table)
		err := tx.Commit()
		if err == nil && !waited {
			err = fmt.Errorf("no statement on %s waited for the lock within 30 s", table)
		}
		released <- err
	}()
	return released
}
