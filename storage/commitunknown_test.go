package storage

import (
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
