package main

// The serving lease of a cell process: waiting for it, keeping it.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"redcell/cell"
	"redcell/storage"
)

// waitLease takes the cell's lease for this process's slot, trying every
// 250 ms while another process holds it, until ctx ends (storage.TakeLease,
// on the server the cell serves from).
func waitLease(ctx context.Context, cfg cell.Config, proc string, ttl time.Duration, log *slog.Logger) (storage.Lease, error) {
	host, _ := os.Hostname()
	slot := cfg.Name + "/" + proc
	holder := fmt.Sprintf("%s on %s pid %d", slot, host, os.Getpid())
	// One line when the wait begins, and one each time the holder changes
	// or the tries start failing; not one per try.
	var loggedHolder string
	var loggedErr bool
	var pools leasePools
	defer pools.close()
	for {
		l, ok, other, left, err := pools.try(ctx, cfg, slot, holder, ttl)
		switch {
		case ok:
			if other != "" && other != holder {
				log.Info("lease taken: this process serves the cell", "slot", slot, "generation", l.Generation, "previous_holder", other)
			}
			return l, nil
		case err != nil:
			if !loggedErr {
				loggedErr = true
				log.Warn("lease: cannot take it yet", "slot", slot, "err", err)
			}
		case other != loggedHolder:
			loggedHolder, loggedErr = other, false
			log.Info("lease held by another process of this cell: waiting to take over", "slot", slot, "holder", other, "expires_in", left.Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return storage.Lease{}, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// leasePools are waitLease's pools, one per server it tried, each with the
// lease tables made sure of once.
type leasePools map[string]*sql.DB

// try is one try of waitLease on the server that serves the cell now.
func (p *leasePools) try(ctx context.Context, cfg cell.Config, slot, holder string, ttl time.Duration) (l storage.Lease, ok bool, other string, left time.Duration, err error) {
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	dsn, _, err := storage.Serving(tctx, cfg.DSN, cfg.StandbyDSN)
	if err != nil {
		return l, false, "", 0, err
	}
	if *p == nil {
		*p = leasePools{}
	}
	db := (*p)[dsn]
	if db == nil {
		if db, err = storage.OpenRaw(dsn); err != nil {
			return l, false, "", 0, err
		}
		if err := storage.EnsureLease(tctx, db); err != nil {
			db.Close()
			return l, false, "", 0, err
		}
		(*p)[dsn] = db
	}
	return storage.TakeLease(tctx, db, cfg.Name, slot, holder, ttl)
}

func (p leasePools) close() {
	for _, db := range p {
		db.Close()
	}
}

// keepLease renews the lease every quarter of its TTL; it ends leaseLost's
// context once a renewal finds the lease taken by another process. A
// renewal that fails otherwise (the database down) is tried again: only a
// process that took the lease stops this one, and its connections are
// fenced meanwhile.
func keepLease(ctx context.Context, store *storage.MySQL, l storage.Lease, lost context.CancelCauseFunc, log *slog.Logger) {
	t := time.NewTicker(l.TTL / 4)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, l.TTL/2)
		err := store.RenewLease(rctx, l)
		cancel()
		switch {
		case errors.Is(err, storage.ErrLeaseLost):
			lost(err)
			return
		case err != nil && !failing:
			failing = true
			log.Warn("lease: renewal failing (another process may take over once it expires)", "err", err)
		case err == nil && failing:
			failing = false
			log.Info("lease: renewed again")
		}
	}
}
