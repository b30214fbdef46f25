package cell

import (
	"redcell/api"
	"redcell/model"
)

// Degrade names the features a cell can switch off at run time to shed load
// from its non-critical paths, or to step around a part that misbehaves (QQ's
// degraded answers, DESIGN.md §1). Opens, sends, deposits and accounts have no
// switch: they are the critical path. true = switched off (degraded).
type Degrade struct {
	// ClaimsList: packet detail answers without its claims and runs no claims
	// query; the answer says so (claims_degraded).
	ClaimsList bool
	// GrabCache: grab reads the packet row from the database, the exact answer,
	// and never memcached (whose copy may be wrong while it misbehaves). The
	// open worker still writes the cache after each commit, so the copy is
	// fresh when the switch goes back on.
	GrabCache bool
	// Relay: the relay delivers nothing: new claims wait in the outbox (the
	// audit counts them as in flight) and go out by the outbox scan once the
	// switch is back on. Credits other cells send here are still applied.
	Relay bool
}

// degradeSwitch indexes Server.degraded.
type degradeSwitch int

const (
	switchClaimsList degradeSwitch = iota
	switchGrabCache
	switchRelay
	switchCount
)

// switchNames are the switches' names in the admin API, the config and the
// metrics (redcell_degrade_switch{switch=...}).
var switchNames = [switchCount]string{"claims_list", "grab_cache", "relay"}

const (
	switchOn  = "on"
	switchOff = "off"
)

// isDegraded reports whether the switch is off now.
func (s *Server) isDegraded(sw degradeSwitch) bool { return s.degraded[sw].Load() }

// Degraded returns every switch as it is now.
func (s *Server) Degraded() api.DegradeSetting {
	state := func(sw degradeSwitch) string {
		if s.isDegraded(sw) {
			return switchOff
		}
		return switchOn
	}
	return api.DegradeSetting{ClaimsList: state(switchClaimsList), GrabCache: state(switchGrabCache), Relay: state(switchRelay)}
}

// SetDegrade switches the features d names ("on" or "off") and keeps those it
// leaves empty. Nothing changes unless every value is valid. Each change is
// logged (a warning when a feature goes off) and takes effect for the requests
// and relay passes that start after it. Errors: ErrInvalidArgument.
func (s *Server) SetDegrade(d api.DegradeSetting) error {
	values := [switchCount]string{d.ClaimsList, d.GrabCache, d.Relay}
	for i, v := range values {
		if v != "" && v != switchOn && v != switchOff {
			return model.Invalidf("%s must be \"on\" or \"off\", got %q", switchNames[i], v)
		}
	}
	for i, v := range values {
		if v == "" {
			continue
		}
		off := v == switchOff
		if s.degraded[i].Swap(off) == off {
			continue
		}
		if off {
			s.log.Warn("degrade switch turned off: feature degraded", "switch", switchNames[i])
		} else {
			s.log.Info("degrade switch turned on: feature restored", "switch", switchNames[i])
		}
	}
	return nil
}

// setDegradeConfig applies the switches of the config at start, quietly
// unless something starts degraded.
func (s *Server) setDegradeConfig(d Degrade) {
	for i, off := range [switchCount]bool{d.ClaimsList, d.GrabCache, d.Relay} {
		s.degraded[i].Store(off)
		if off {
			s.log.Warn("degrade switch off from the config: feature degraded", "switch", switchNames[i])
		}
	}
}
