package sim

import "time"

// scheduleFaults starts the crash and link-cut processes; both stop when the
// network heals.
func (w *world) scheduleFaults() {
	f := w.cfg.Faults
	if f.CrashMeanMS > 0 {
		w.at(w.expDelay(f.CrashMeanMS), w.crashOne)
	}
	if f.CutMeanMS > 0 {
		w.at(w.expDelay(f.CutMeanMS), w.cutOne)
	}
}

// expDelay draws an exponentially distributed delay of the given mean.
func (w *world) expDelay(meanMS int64) time.Duration {
	return time.Duration(w.rngFault.ExpFloat64()*float64(meanMS)) * time.Millisecond
}

// crashOne crashes a cell that is up and schedules its restart and the next crash.
func (w *world) crashOne() {
	if w.healed {
		return
	}
	f := w.cfg.Faults
	c := w.cells[w.rngFault.IntN(len(w.cells))]
	if !c.down {
		c.crash()
		down := time.Duration(f.DownMinMS+w.rngFault.Int64N(f.DownMaxMS-f.DownMinMS+1)) * time.Millisecond
		w.at(down, func() {
			if c.down && !w.healed {
				c.restart()
			}
		})
	}
	w.at(w.expDelay(f.CrashMeanMS), w.crashOne)
}

// cutOne cuts one direction of one link between the router and a cell or
// between two cells, and joins it again later.
func (w *world) cutOne() {
	if w.healed {
		return
	}
	f := w.cfg.Faults
	from := nodeRouter + w.rngFault.IntN(cellCount+1)
	to := nodeRouter + w.rngFault.IntN(cellCount+1)
	if from != to && !w.cut[from][to] {
		w.cut[from][to] = true
		w.count("net.link_cut")
		w.log.begin(w, "cut").i(int64(from)).i(int64(to)).end()
		w.at(time.Duration(1+w.rngFault.Int64N(max(f.CutMaxMS, 1)))*time.Millisecond, func() {
			w.cut[from][to] = false
			w.log.begin(w, "join").i(int64(from)).i(int64(to)).end()
		})
	}
	w.at(w.expDelay(f.CutMeanMS), w.cutOne)
}
