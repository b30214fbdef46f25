package main

import (
	"context"
	"errors"
	"time"
)

// setClusterStrategy switches the open strategy of every cell in the config
// through the cells' admin ports (admin_listen, admin_token).
func setClusterStrategy(ctx context.Context, configPath, strategy string) error {
	return errors.New("setClusterStrategy: not built yet")
}

// dbLimit measures, on the first cell's database and without HTTP, how many
// opens per second one writer reaches on one hot packet committing batches of
// batch opens (shadow tables; nothing real is touched).
func dbLimit(ctx context.Context, configPath string, batch int, d time.Duration) (float64, error) {
	return 0, errors.New("dbLimit: not built yet")
}
