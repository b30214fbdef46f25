package storage_test

import (
	"reflect"
	"slices"
	"testing"

	"redcell/storage"
)

// TestStoreShape: the store contract stays small. Store, counted with its
// embedded interfaces, is one write method (CommitGroup), one read method
// (Read), the audits, the schema and Ping; an operation is a type of its own
// (storage/op.go), never a method more.
func TestStoreShape(t *testing.T) {
	st := reflect.TypeOf((*storage.Store)(nil)).Elem()
	var names []string
	for i := range st.NumMethod() {
		names = append(names, st.Method(i).Name)
	}
	want := []string{"CellAudit", "CommitGroup", "EnsureDays", "EnsureShard", "Ledger", "Ping", "Read"}
	if !slices.Equal(names, want) {
		t.Fatalf("storage.Store has %d methods %v, want %v (at most 12: add an op or a query, not a method)", len(names), names, want)
	}
}
