package rules

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"redcell/internal/clock"
	"redcell/internal/yamlfile"
)

// Source is the table read from a rules file, kept current: Reload reads the
// file again, Watch does when it changes. A file that does not parse leaves
// the table in force as it was. Safe for concurrent use.
type Source struct {
	path      string
	routes    []string
	newBucket NewBucket
	log       *slog.Logger

	table atomic.Pointer[Table]

	mu      sync.Mutex // serializes loads; guards last, loaded, lastErr
	last    []byte     // the content in force
	loaded  bool       // last is set
	existed bool       // a file was read once: its vanishing keeps the table
	lastErr string     // the last load's error, "" after a good one
}

// errVanished: the rules file was read before and is gone now.
var errVanished = errors.New("rules: the rules file is gone; the rules read before stay in force until it is back (to lift them all, leave an empty file)")

// Open reads path and compiles it (Parse). A file that does not exist yet is
// the empty table (Reload picks it up once written); one that does not parse
// is an error.
func Open(path string, routeNames []string, newBucket NewBucket, log *slog.Logger) (*Source, error) {
	s := &Source{path: path, routes: routeNames, newBucket: newBucket, log: log}
	s.table.Store(Empty(len(routeNames)))
	if _, err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Table is the table in force.
func (s *Source) Table() *Table { return s.table.Load() }

// Reload reads the file again and, when its content changed, puts the new
// table in force (counters start over). It reports whether it changed.
// Errors: the file cannot be read, or does not parse (the table in force
// stays).
func (s *Source) Reload() (changed bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		if s.existed {
			// Gone after it was read (a deploy tool's delete and create): the
			// rules in force stay, so a moment without the file lifts no block.
			s.lastErr = errVanished.Error()
			return false, errVanished
		}
		b, err = nil, nil
	}
	if err != nil {
		s.lastErr = err.Error()
		return false, fmt.Errorf("rules: %w", err)
	}
	if s.loaded && bytes.Equal(b, s.last) {
		s.lastErr = ""
		return false, nil
	}
	t := Empty(len(s.routes))
	if b != nil {
		t.Version = yamlfile.Version(b) // a template of comments has one too
	}
	if !blank(b) {
		if t, err = Parse(b, s.routes, s.newBucket); err != nil {
			s.lastErr = err.Error()
			return false, fmt.Errorf("rules: %s: %w", s.path, err)
		}
	}
	s.last, s.lastErr, s.loaded = b, "", true
	s.existed = s.existed || b != nil
	s.table.Store(t)
	s.log.Info("rules loaded", "file", s.path, "version", t.Version, "rules", len(t.rules), "degraded_routes", len(t.Summary(s.routes).Admit))
	return true, nil
}

// Watch reloads the file each time every has passed since the previous
// reload ended (clock.Every), until ctx ends; a file that does not parse is
// logged once per content and the table in force kept.
func (s *Source) Watch(ctx context.Context, every time.Duration) {
	logged := ""
	clock.Every(ctx, nil, every, func(int) {
		if _, err := s.Reload(); err != nil && err.Error() != logged {
			logged = err.Error()
			s.log.Error("rules file refused; the rules in force stay", "err", err)
		} else if err == nil {
			logged = ""
		}
	})
}

// blank reports whether b holds nothing but blank lines and comments: the
// empty table (a template with every line commented out).
func blank(b []byte) bool {
	for _, line := range bytes.Split(b, []byte("\n")) {
		if l := bytes.TrimSpace(line); len(l) > 0 && l[0] != '#' {
			return false
		}
	}
	return true
}

// Path is the file's path.
func (s *Source) Path() string { return s.path }

// LastError is the last load's error, "" when it went well.
func (s *Source) LastError() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr
}
