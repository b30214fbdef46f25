package sim

import (
	"bytes"
	"hash"
	"hash/fnv"
	"sort"
	"strconv"

	"redcell/model"
)

// eventLog hashes every line the run logs and keeps those that name a trace
// key. A line is built in one reused buffer: begin, fields, end.
type eventLog struct {
	h    hash.Hash64
	buf  []byte
	keys [][]byte
	// primary holds the lines naming the first key (the claim or packet a
	// violation is about), others those naming only the other keys (its
	// packet, say, which may be hot): each keeps its last traceMax lines, so
	// a busy packet does not push its claim's lines out.
	primary, others []traced
	lines           int64
}

type traced struct {
	n    int64 // line number in the log
	text string
}

// traceMax bounds each part of the trace kept: the last lines matter most,
// but a run that names a hot key could otherwise keep millions.
const traceMax = 400

func (l *eventLog) init(keys []string) {
	l.h = fnv.New64a()
	for _, k := range keys {
		if k != "" {
			l.keys = append(l.keys, []byte(k))
		}
	}
}

// line is a log line under construction.
type line struct{ l *eventLog }

func (l *eventLog) begin(w *world, kind string) line {
	l.buf = l.buf[:0]
	l.buf = append(l.buf, "e"...)
	l.buf = strconv.AppendInt(l.buf, w.events, 10)
	l.buf = append(l.buf, " t="...)
	l.buf = strconv.AppendInt(l.buf, w.now, 10)
	l.buf = append(l.buf, ' ')
	l.buf = append(l.buf, kind...)
	return line{l}
}

func (x line) s(v string) line {
	x.l.buf = append(x.l.buf, ' ')
	x.l.buf = append(x.l.buf, v...)
	return x
}

func (x line) i(v int64) line {
	x.l.buf = append(x.l.buf, ' ')
	x.l.buf = strconv.AppendInt(x.l.buf, v, 10)
	return x
}

func (x line) kv(k string, v int64) line {
	x.l.buf = append(x.l.buf, ' ')
	x.l.buf = append(x.l.buf, k...)
	x.l.buf = append(x.l.buf, '=')
	x.l.buf = strconv.AppendInt(x.l.buf, v, 10)
	return x
}

// credits appends the claim IDs of cs.
func (x line) credits(cs []model.Credit) line {
	for _, c := range cs {
		x.l.buf = append(x.l.buf, ' ')
		x.l.buf = append(x.l.buf, c.ClaimID...)
	}
	return x
}

func (x line) end() {
	l := x.l
	l.buf = append(l.buf, '\n')
	l.h.Write(l.buf)
	l.lines++
	for i, k := range l.keys {
		if bytes.Contains(l.buf, k) {
			t := traced{n: l.lines, text: string(l.buf[:len(l.buf)-1])}
			if i == 0 {
				l.primary = keep(l.primary, t)
			} else {
				l.others = keep(l.others, t)
			}
			break
		}
	}
}

// keep appends t to ring, dropping its oldest line when full.
func keep(ring []traced, t traced) []traced {
	if len(ring) == traceMax {
		copy(ring, ring[1:])
		ring = ring[:traceMax-1]
	}
	return append(ring, t)
}

// trace merges the kept lines in log order.
func (l *eventLog) trace() []string {
	all := append(append([]traced(nil), l.primary...), l.others...)
	sort.Slice(all, func(i, j int) bool { return all[i].n < all[j].n })
	out := make([]string, len(all))
	for i, t := range all {
		out[i] = t.text
	}
	return out
}

func (l *eventLog) sum() string { return strconv.FormatUint(l.h.Sum64(), 16) }
