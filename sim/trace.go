package sim

import (
	"bytes"
	"hash"
	"hash/fnv"
	"strconv"

	"redcell/model"
)

// eventLog hashes every line the run logs and keeps those that name a trace
// key. A line is built in one reused buffer: begin, fields, end.
type eventLog struct {
	h     hash.Hash64
	buf   []byte
	keys  [][]byte
	trace []string
}

// traceMax bounds the trace kept: the last lines matter most, but a run that
// names a hot key could otherwise keep millions.
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
	for _, k := range l.keys {
		if bytes.Contains(l.buf, k) {
			if len(l.trace) == traceMax {
				copy(l.trace, l.trace[1:])
				l.trace = l.trace[:traceMax-1]
			}
			l.trace = append(l.trace, string(l.buf[:len(l.buf)-1]))
			break
		}
	}
}

func (l *eventLog) sum() string { return strconv.FormatUint(l.h.Sum64(), 16) }
