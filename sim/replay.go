package sim

// Same reports whether two violations are the same failure: the same check
// after the same event with the same detail.
func Same(a, b *Violation) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Check == b.Check && a.Event == b.Event && a.Detail == b.Detail
}

// Explain replays cfg, which failed with v, and keeps the event-log lines
// naming v's keys (the last traceMax naming its first key, and as many
// naming the others) up to the violation, where the
// replay stops. It returns them and the replay's own violation, which for a
// deterministic simulation is the same as v (Same).
func Explain(cfg Config, v *Violation) (trace []string, again *Violation) {
	cfg.TraceKeys = v.Keys
	r := Run(cfg)
	return r.Trace, r.Violation
}

// Shrink looks for a shorter run of cfg's seed that fails the same check as
// v: first with as many steps as had started when v was found, then by
// bisection below that, at most runs runs. It returns the config of the
// shortest failing run and its violation (cfg and v when none is shorter).
func Shrink(cfg Config, v *Violation, runs int) (Config, *Violation) {
	best, bestV := cfg, v
	try := func(steps int) bool {
		c := cfg
		c.Steps = steps
		r := Run(c)
		runs--
		if r.Violation != nil && r.Violation.Check == v.Check {
			best, bestV = c, r.Violation
			return true
		}
		return false
	}
	hi := v.Step
	if hi < 1 || hi >= cfg.Steps || runs < 1 || !try(hi) {
		hi = best.Steps
	}
	lo := 0 // a run of lo steps is not known to fail
	for runs > 0 && hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if try(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return best, bestV
}
