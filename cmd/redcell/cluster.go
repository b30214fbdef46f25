package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"time"

	"redcell/api"
	"redcell/model"
	"redcell/sharding"
	"redcell/storage"
)

// adminCall sends one request to a cell's admin port with the bearer token and
// decodes a 200 answer into out.
func adminCall(ctx context.Context, fc fileConfig, c cellEntry, method, path string, in, out any) error {
	if c.AdminListen == "" {
		return fmt.Errorf("cell %s has no admin_listen in the config", c.Name)
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.AdminListen+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+fc.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("cell %s admin: %w", c.Name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("cell %s admin %s %s: %d %s", c.Name, method, path, resp.StatusCode, b)
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// setClusterStrategy switches the open strategy of every cell in the config
// through the cells' admin ports (admin_listen, admin_token), keeping each
// cell's batch settings.
func setClusterStrategy(ctx context.Context, configPath, strategy string) error {
	fc, err := loadConfig(configPath)
	if err != nil {
		return err
	}
	for _, c := range fc.Cells {
		var st api.StrategySetting
		if err := adminCall(ctx, fc, c, http.MethodGet, "/admin/strategy", nil, &st); err != nil {
			return err
		}
		st.Strategy = strategy
		if err := adminCall(ctx, fc, c, http.MethodPut, "/admin/strategy", st, &st); err != nil {
			return err
		}
	}
	return nil
}

// dbLimit measures, on the first cell's database and without HTTP, how many
// opens per second one writer reaches on one hot packet committing batches of
// batch opens: the database's ceiling for the batched hot path. It writes only
// shadow tables (a shadow sender, packet and claimants), so nothing real is
// touched; the claims are credited to shadow wallets by the cells' relays.
func dbLimit(ctx context.Context, configPath string, batch int, d time.Duration) (float64, error) {
	if batch < 1 || batch > 4096 || d <= 0 || d > 5*time.Minute {
		return 0, errors.New("dbLimit: batch must be 1..4096 and d in (0, 5m]")
	}
	fc, err := loadConfig(configPath)
	if err != nil {
		return 0, err
	}
	if len(fc.Cells) == 0 {
		return 0, errors.New("dbLimit: no cells in the config")
	}
	owned, err := sharding.ParseRanges(fc.Cells[0].Shards)
	if err != nil {
		return 0, err
	}
	real, err := openCellDB(fc.Cells[0], 4)
	if err != nil {
		return 0, err
	}
	defer real.Close()
	st := real.Shadow()
	run := fmt.Sprintf("lim%x", time.Now().UnixNano()&0xffffffffff)
	sender := ""
	for i := 0; sender == ""; i++ {
		if a := fmt.Sprintf("%s-s%d", run, i); owned.Contains(sharding.ShardOfAct(a)) {
			sender = a
		}
	}
	s := sharding.ShardOfAct(sender)
	const total = 10_000_000 // cents and shares: every share is 1 cent, the packet never runs out
	if _, err := storage.Deposit(ctx, st, s, sender, run+"-dep", total); err != nil {
		return 0, err
	}
	id := model.NewPacketID(s, time.Now())
	if _, _, err := storage.Send(ctx, st, s, model.SendRequest{Sender: sender, Amount: total, Count: total, Kind: model.KindRandom, OrderNo: run + "-snd"},
		id, time.Now().Add(time.Hour).UnixMilli()); err != nil {
		return 0, err
	}
	ref, _ := model.ParsePacketID(string(id))
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	reqs := make([]model.OpenRequest, batch)
	opened, n := 0, 0
	start := time.Now()
	for time.Since(start) < d && ctx.Err() == nil && opened+batch <= total {
		for i := range reqs {
			act := fmt.Sprintf("%s-o%d", run, n)
			n++
			reqs[i] = model.OpenRequest{ActID: act, Shard: sharding.ShardOfAct(act)}
		}
		res, _, err := storage.OpenBatch(ctx, st, ref, reqs, r)
		if err != nil {
			return 0, err
		}
		for _, x := range res {
			if x.Err == nil && !x.Repeat {
				opened++
			}
		}
	}
	return float64(opened) / time.Since(start).Seconds(), nil
}
