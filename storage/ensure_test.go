package storage

import (
	"context"
	"testing"

	"redcell/internal/testenv"
	"redcell/model"
)

// A process that finds a shard's tables made (by another process, or before
// a restart) reads the schema once instead of running their DDL: one round
// trip for the shard's tables, one for a day's. Tables of an older version
// (a column or index added since) are brought up to date.
func TestEnsureReadsTheSchema(t *testing.T) {
	ctx := context.Background()
	prefix := "e" + testenv.Prefix() + "_"
	open := func() *MySQL {
		m, err := OpenPrefixed(testenv.MySQLDSN(t, 1), 4, prefix)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	first := open()
	t.Cleanup(func() { dropNamespace(t, first) })
	const s, day = model.ShardID(123), 7
	trips := func(m *MySQL, fn func() error) int64 {
		t.Helper()
		before := m.RoundTrips()
		if err := fn(); err != nil {
			t.Fatal(err)
		}
		return m.RoundTrips() - before
	}
	if n := trips(first, func() error { return first.EnsureDay(ctx, s, day) }); n < 1+6+4 {
		t.Fatalf("making the tables took %d round trips: want the probes and the DDL (at least 11)", n)
	}
	if n := trips(first, func() error { return first.EnsureDay(ctx, s, day) }); n != 0 {
		t.Errorf("a second EnsureDay in one process: %d round trips, want 0", n)
	}

	again := open() // another process, the tables made
	if n := trips(again, func() error { return again.EnsureShard(ctx, s) }); n != 1 {
		t.Errorf("EnsureShard of made tables: %d round trips, want 1 (the schema read)", n)
	}
	if n := trips(again, func() error { return again.EnsureDay(ctx, s, day) }); n != 1 {
		t.Errorf("EnsureDay of made tables: %d round trips, want 1 (the schema read)", n)
	}
	if n := trips(again, func() error { return again.EnsureArchive(ctx, s) }); n < 2 {
		t.Errorf("EnsureArchive of missing archive tables: %d round trips, want the probe and the DDL", n)
	}

	// Many shards at once (a batch of credits): one read for those not made
	// sure of yet; a shard not made goes through its DDL.
	for _, sh := range []model.ShardID{124, 125} {
		if err := first.EnsureShard(ctx, sh); err != nil {
			t.Fatal(err)
		}
	}
	batch := open()
	if n := trips(batch, func() error { return batch.EnsureShards(ctx, []model.ShardID{123, 124, 125, 123}) }); n != 1 {
		t.Errorf("EnsureShards of 3 made shards: %d round trips, want 1", n)
	}
	if n := trips(batch, func() error { return batch.EnsureShards(ctx, []model.ShardID{124, 125, 126}) }); n < int64(1+len(batch.shardDDL(126))) {
		t.Errorf("EnsureShards of 2 made shards and a new one: %d round trips, want the new one's probe and DDL", n)
	}
	if ok, err := batch.schemaHas(ctx, batch.shardNeeds(126)); err != nil || !ok {
		t.Errorf("after EnsureShards: shard 126's tables present = %v (%v)", ok, err)
	}

	// Older versions: the claim table without k_created, act_shard and
	// dest. A new process adds them.
	for _, q := range []string{
		"ALTER TABLE " + first.claimTable(s, day) + " DROP COLUMN dest, DROP COLUMN act_shard",
		"ALTER TABLE " + first.claimTable(s, day) + " DROP INDEX k_created",
	} {
		if _, err := first.db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	old := open()
	if n := trips(old, func() error { return old.EnsureDay(ctx, s, day) }); n < int64(1+len(old.dayDDL(s, day))) {
		t.Errorf("EnsureDay of old tables: %d round trips, want the probes and the DDL", n)
	}
	for _, need := range append(old.dayNeeds(s, day), needOf(old.claimTable(s, day), "act_shard", "")) {
		ok, err := old.schemaHas(ctx, []schemaNeed{need})
		if err != nil || !ok {
			t.Errorf("after EnsureDay: %+v present = %v (%v), want true", need, ok, err)
		}
	}
	// A missing table is missing, not taken for made.
	if ok, err := old.schemaHas(ctx, []schemaNeed{needOf(old.packetTable(s, day+1), "", "k_created"), needOf(old.accountTable(s), "", "")}); err != nil || ok {
		t.Errorf("schemaHas with a missing table = %v (%v), want false", ok, err)
	}
}
