package membership

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"time"
)

const (
	// logEvery: memberlist repeats a complaint every probe or gossip round
	// (about once a second) while a peer cannot be reached, until it is
	// declared dead; one line per kind in this interval is enough to see it.
	logEvery = 10 * time.Second
	// logKindsMax bounds the kinds of line remembered; past it they share one.
	logKindsMax = 64
)

// logWriter forwards memberlist's warnings and errors to slog and drops its
// debug chatter. Each kind of line (its level and its text up to the first
// digit, colon or quote, so that a complaint about any address or node is one
// kind) is forwarded at most once per logEvery; the next one forwarded says
// how many of its kind were dropped since the last ("repeated"). Safe for
// concurrent use.
type logWriter struct {
	log *slog.Logger
	now func() time.Time // time.Now; tests set another

	mu    sync.Mutex // guards kinds
	kinds map[string]*logKind
}

type logKind struct {
	at      time.Time // when a line of this kind was last forwarded
	dropped int       // lines of this kind dropped since
}

func newLogWriter(log *slog.Logger) *logWriter {
	return &logWriter{log: log, now: time.Now, kinds: map[string]*logKind{}}
}

func (w *logWriter) Write(p []byte) (int, error) {
	line := string(bytes.TrimSpace(p))
	var level slog.Level
	switch {
	case bytes.Contains(p, []byte("use of closed network connection")):
		return len(p), nil // memberlist's own shutdown racing its gossip timer: not a fault
	case bytes.Contains(p, []byte("Got ping for unexpected node")):
		// A probe for the process that held this gossip port before (a restart
		// on the same port): expected until the others declare it dead.
		level = slog.LevelInfo
	case bytes.Contains(p, []byte("[ERR]")):
		level = slog.LevelError
	case bytes.Contains(p, []byte("[WARN]")):
		level = slog.LevelWarn
	default:
		return len(p), nil
	}
	repeated, ok := w.admit(logKindOf(p))
	if !ok {
		return len(p), nil
	}
	attrs := []any{"msg", line}
	if repeated > 0 {
		attrs = append(attrs, "repeated", repeated)
	}
	w.log.Log(context.Background(), level, "memberlist", attrs...)
	return len(p), nil
}

// admit reports whether a line of kind is forwarded now, and how many of its
// kind were dropped since the last one forwarded.
func (w *logWriter) admit(kind string) (repeated int, ok bool) {
	now := w.now()
	w.mu.Lock()
	defer w.mu.Unlock()
	k := w.kinds[kind]
	if k == nil {
		if len(w.kinds) >= logKindsMax {
			kind = ""
			k = w.kinds[kind]
		}
		if k == nil {
			w.kinds[kind] = &logKind{at: now}
			return 0, true
		}
	}
	if now.Sub(k.at) < logEvery {
		k.dropped++
		return 0, false
	}
	repeated, k.at, k.dropped = k.dropped, now, 0
	return repeated, true
}

// logKindOf is a memberlist line's level and text, from its "[LEVEL]" up to
// the first digit, colon or quote after the "memberlist: " that follows.
func logKindOf(p []byte) string {
	if i := bytes.IndexByte(p, '['); i >= 0 {
		p = p[i:] // drop the timestamp
	}
	level, rest, _ := bytes.Cut(p, []byte(" "))
	rest = bytes.TrimPrefix(rest, []byte("memberlist: "))
	if i := bytes.IndexAny(rest, "0123456789:'\""); i >= 0 {
		rest = rest[:i]
	}
	return string(level) + " " + string(rest)
}
