package main

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"redcell/api"
	"redcell/model"
)

// cellJobs runs the router's POST /admin/cells: one change of the cells at a
// time, in the background, with the moves of redcell cells (router.CellOps).
type cellJobs struct {
	ctx    context.Context // the router's life: a change stops with it (the move in progress is undone)
	fc     fileConfig
	config string // the config's path: the state files go beside it
	log    *slog.Logger

	mu  sync.Mutex
	job api.CellsJob
}

const cellJobLines = 200

func newCellJobs(ctx context.Context, fc fileConfig, config string, log *slog.Logger) *cellJobs {
	return &cellJobs{ctx: ctx, fc: fc, config: config, log: log, job: api.CellsJob{State: "none", Lines: []string{}}}
}

// Start implements router.CellOps.
func (j *cellJobs) Start(req api.CellsRequest) (api.CellsJob, error) {
	j.mu.Lock()
	if j.job.State == "running" {
		j.mu.Unlock()
		return api.CellsJob{}, model.Errorf(model.ErrOverloaded, "a change of the cells is running (%s); see GET /admin/cells", j.job.Request.Op)
	}
	j.mu.Unlock()
	if req.Op != "add" && req.Op != "remove" && req.Op != "move" {
		return api.CellsJob{}, model.Invalidf("op must be add, remove or move")
	}
	if req.Limit < 0 {
		return api.CellsJob{}, model.Invalidf("limit must be 0 (all) or more")
	}
	ex := newMoveExec(j.fc, 10*time.Second)
	pctx, cancel := context.WithTimeout(j.ctx, 30*time.Second)
	moves, path, err := ex.prepare(pctx, req, "", j.config)
	cancel()
	if err != nil {
		return api.CellsJob{}, model.Invalidf("%v", err)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.job.State == "running" {
		return api.CellsJob{}, model.Errorf(model.ErrOverloaded, "a change of the cells is running")
	}
	j.job = api.CellsJob{State: "running", Request: req, StartedMS: time.Now().UnixMilli(), Lines: []string{}}
	ex.out = jobWriter{j}
	go func() {
		err := ex.run(j.ctx, moves, path, false, req.Limit)
		j.mu.Lock()
		defer j.mu.Unlock()
		j.job.EndedMS, j.job.State = time.Now().UnixMilli(), "done"
		if err != nil {
			j.job.State, j.job.Error = "failed", err.Error()
			j.log.Error("cluster change failed", "op", req.Op, "err", err)
			return
		}
		j.log.Info("cluster change done", "op", req.Op, "name", req.Name)
	}()
	return j.copyLocked(), nil
}

// Job implements router.CellOps.
func (j *cellJobs) Job() api.CellsJob {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.copyLocked()
}

func (j *cellJobs) copyLocked() api.CellsJob {
	out := j.job
	out.Lines = make([]string, len(j.job.Lines))
	for i, l := range j.job.Lines {
		out.Lines[i] = strings.TrimSuffix(l, "\n")
	}
	return out
}

// jobWriter keeps the progress lines of the running change.
type jobWriter struct{ j *cellJobs }

func (w jobWriter) Write(p []byte) (int, error) {
	w.j.mu.Lock()
	defer w.j.mu.Unlock()
	text := string(p)
	lines := w.j.job.Lines
	// A move's line is written in two parts (its start, then its result).
	if n := len(lines); n > 0 && !strings.HasSuffix(lines[n-1], "\n") {
		lines[n-1] += text
	} else {
		lines = append(lines, text)
	}
	if len(lines) > cellJobLines {
		lines = lines[len(lines)-cellJobLines:]
	}
	w.j.job.Lines = lines
	return len(p), nil
}
