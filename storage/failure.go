package storage

import (
	"errors"

	"github.com/go-sql-driver/mysql"
)

// Server error numbers that mean the server cannot take calls now.
const (
	errTooManyConns   = 1040 // ER_CON_COUNT_ERROR
	errServerShutdown = 1053 // ER_SERVER_SHUTDOWN
	errConnKilled     = 1927 // ER_CONNECTION_KILLED (MariaDB)
)

// DriverFailure reports whether err is the MySQL driver's or the server's way
// of saying the server cannot serve calls now: a connection that broke mid-call
// (mysql.ErrInvalidConn), a garbled packet stream, or a server error for too
// many connections, a shutdown in progress or a killed connection. Business
// answers (model errors, duplicate keys, deadlocks) are not failures. Generic
// network errors (refused, reset, timeouts, driver.ErrBadConn) are not listed
// here; cell/guard.Infrastructure checks those, and the database breaker
// (cell/guard.Breaker.Allow) counts both.
func DriverFailure(err error) bool {
	if errors.Is(err, mysql.ErrInvalidConn) || errors.Is(err, mysql.ErrMalformPkt) || errors.Is(err, mysql.ErrPktSync) || errors.Is(err, mysql.ErrPktSyncMul) {
		return true
	}
	return isMySQLErr(err, errTooManyConns) || isMySQLErr(err, errServerShutdown) || isMySQLErr(err, errConnKilled)
}
