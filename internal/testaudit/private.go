package testaudit

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"strings"
	"testing"
	"time"
)

// PrivatePrefix answers a fresh database name prefix (storage.OpenPrefixed)
// for a test that leaves differences on purpose (planted faults, dropped
// databases, moves) or must not share its databases: every database of the
// prefix is dropped on each server of dsns when the test ends (its cleanup
// is registered now, so it runs after the cleanups registered later, such as
// stopping the test's cells), before any closing audit reads the servers.
func PrivatePrefix(t testing.TB, dsns ...string) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	prefix := "p" + hex.EncodeToString(b[:]) + "_"
	t.Cleanup(func() {
		for _, dsn := range dsns {
			if err := DropPrefix(dsn, prefix); err != nil {
				t.Errorf("drop the databases of %s: %v", prefix, err)
			}
		}
	})
	return prefix
}

// DropPrefix drops every database whose name starts with prefix on the
// server at dsn.
func DropPrefix(dsn, prefix string) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rows, err := db.QueryContext(ctx, "SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME LIKE ?", strings.ReplaceAll(prefix, "_", `\_`)+"%")
	if err != nil {
		return err
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return err
		}
		names = append(names, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, n := range names {
		if _, err := db.ExecContext(ctx, "DROP DATABASE `"+n+"`"); err != nil {
			return err
		}
	}
	return nil
}
