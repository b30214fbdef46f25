package storage

import (
	"database/sql/driver"
	"errors"
	"testing"

	"github.com/go-sql-driver/mysql"

	"redcell/model"
)

// TestCommitUnknownAnswers: a COMMIT whose connection broke is an unknown
// outcome answered as a retryable DB_UNAVAILABLE; one that failed otherwise
// stays an unknown outcome (INTERNAL).
func TestCommitUnknownAnswers(t *testing.T) {
	broken := commitUnknown(mysql.ErrInvalidConn)
	if code, _ := model.CodeOf(broken); code != "DB_UNAVAILABLE" || !errors.Is(broken, ErrCommitUnknown) || !errors.Is(broken, mysql.ErrInvalidConn) {
		t.Fatalf("broken connection at COMMIT: code %s, %v", code, broken)
	}
	other := commitUnknown(errors.New("something else"))
	if code, _ := model.CodeOf(other); code != "INTERNAL" || !errors.Is(other, ErrCommitUnknown) || errors.Is(other, model.ErrDBUnavailable) {
		t.Fatalf("another COMMIT failure: code %s, %v", code, other)
	}
}

// TestSwitchErrorsAnswers: what a promotion or a switch back makes the
// cell's calls fail with is a retryable DB_UNAVAILABLE, and a call on a
// connection of the old server is still driver.ErrBadConn to database/sql
// (which then takes another connection).
func TestSwitchErrorsAnswers(t *testing.T) {
	for _, err := range []error{errStale, errPromoting, errSwitching} {
		if code, _ := model.CodeOf(err); code != "DB_UNAVAILABLE" {
			t.Errorf("%v: code %s, want DB_UNAVAILABLE", err, code)
		}
	}
	if !errors.Is(errStale, driver.ErrBadConn) {
		t.Errorf("errStale is not driver.ErrBadConn to database/sql")
	}
}
