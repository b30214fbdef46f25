package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"redcell/model"
)

// prepareShadow creates, in every cell's shadow space (the tables the cells
// keep stress traffic in, which is all bench traffic), the shard tables of
// every shard the cell owns by the cluster's shard map (clusterOwners) and
// the packet and claim tables of today and tomorrow (UTC): what each cell's
// warm-up (cell.Config.WarmSchema) makes at start for its real space only.
// Without it the first runs of a bench on a new cluster create those tables
// as their traffic reaches each shard: on make run's servers (a file per
// table) that took tens of seconds of DDL, paid by whichever run came second
// (its opens waited on the relay's credits to new shards, and the database
// breakers opened), and a strategy compared there looked 3 to 7 times
// slower than one compared first. Tables made before are left as they are
// (CREATE TABLE IF NOT EXISTS), so a later invocation pays a few seconds.
// It prints progress to w every 5 s and the time it took; each cell's
// server is prepared at the same time, 4 statements at once.
func prepareShadow(ctx context.Context, configPath string, w io.Writer) error {
	fc, err := loadConfig(configPath)
	if err != nil {
		return err
	}
	if len(fc.Cells) == 0 {
		return fmt.Errorf("bench: config %s lists no cells", configPath)
	}
	stores, closeStores, err := openCellDBs(fc, 4)
	if err != nil {
		return fmt.Errorf("bench: shadow tables of %w", err) // "... of cell NAME: ..."
	}
	defer closeStores()
	owners, _, err := clusterOwners(fc, func(i int) (string, int64, bool, error) { return stores[i].Ownership(ctx, fc.Cells[i].Name) })
	if err != nil {
		return err
	}
	now := time.Now().UTC()
	days := []int{now.Day(), now.Add(24 * time.Hour).Day()}
	start := time.Now()
	var (
		mu   sync.Mutex
		done = make([]int, len(fc.Cells))
		all  = make([]int, len(fc.Cells))
		last = start
	)
	errs := make([]error, len(fc.Cells))
	var wg sync.WaitGroup
	for i, c := range fc.Cells {
		var shards []model.ShardID
		for s := model.ShardID(0); s < model.ShardCount; s++ {
			if owners[s.DB()] == c.Name {
				shards = append(shards, s)
			}
		}
		all[i] = len(shards)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = stores[i].Shadow().EnsureDays(ctx, shards, days, 4, func(n, _ int) {
				mu.Lock()
				defer mu.Unlock()
				done[i] = n
				if time.Since(last) >= 5*time.Second {
					last = time.Now()
					fmt.Fprintf(w, "bench: creating the shadow tables: %s\n", shadowProgress(fc, done, all))
				}
			})
			if errs[i] != nil {
				errs[i] = fmt.Errorf("bench: shadow tables of cell %s: %w", c.Name, errs[i])
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	fmt.Fprintf(w, "bench: shadow tables of %s ready (days %d and %d) in %s\n", shadowProgress(fc, done, all), days[0], days[1],
		time.Since(start).Round(100*time.Millisecond))
	return nil
}

// shadowProgress says, per cell, how many of its shards' tables are made.
func shadowProgress(fc fileConfig, done, all []int) string {
	s := ""
	for i, c := range fc.Cells {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s %d/%d shards", c.Name, done[i], all[i])
	}
	return s
}
