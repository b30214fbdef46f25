// Package degrade holds a cell's degrade switches: features it can switch off
// at run time to shed load from its non-critical paths, or to step around a
// part that misbehaves (QQ's degraded answers, DESIGN.md §1). Opens, sends,
// deposits and accounts have no switch: they are the critical path.
package degrade

import (
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"redcell/api"
	"redcell/model"
)

// Config lists the features switched off (degraded) at start; true = off.
type Config struct {
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
	// WalletFlow: GET /v1/accounts/{act_id}/flow answers 503 DEGRADED and
	// runs no query; the wallet page still answers its balance.
	WalletFlow bool
	// Booking: the reward booker books nothing: issued rewards wait pending
	// (the wallet shows them as pending; a withdrawal still books the
	// person's own first).
	Booking bool
	// CouponIssue: the coupon layers take no stored request: new requests
	// are still accepted (202) and wait accepted, durable, until the switch
	// is back on; a green-channel request is answered accepted. Requests
	// already in a queue are decided.
	CouponIssue bool
	// TokenRestore: POST /v1/accounts/{act_id}/tokens restores nothing: a
	// valid token whose reward the cell does not hold is refused
	// (TOKEN_RESTORE_OFF) instead of stored again; tokens are still checked
	// and counted, and those the cell holds still answer "known". For a
	// signing key that may have leaked (seed 000): forged tokens would
	// verify, and restoring them would issue rewards nobody was given.
	TokenRestore bool
}

// Switch names one feature.
type Switch int

// The switches.
const (
	ClaimsList Switch = iota
	GrabCache
	Relay
	WalletFlow
	Booking
	CouponIssue
	TokenRestore
	switchCount
)

// names are the switches' names in the admin API, the config and the metrics
// (redcell_degrade_switch{switch=...}).
var names = [switchCount]string{"claims_list", "grab_cache", "relay", "wallet_flow", "booking", "coupon_issue", "token_restore"}

const (
	on  = "on"
	off = "off"
)

// Names returns the switches' names, as the config, the admin API and the
// metrics know them.
func Names() []string { return names[:] }

// Switches is the state of every switch. Safe for concurrent use: a read is
// one atomic load.
type Switches struct {
	off [switchCount]atomic.Bool
	log *slog.Logger
}

// New returns the switches as c sets them, logging a warning for each
// feature that starts switched off.
func New(c Config, log *slog.Logger) *Switches {
	s := &Switches{log: log}
	for i := range switchCount {
		o := *c.field(i)
		s.off[i].Store(o)
		if o {
			log.Warn("degrade switch off from the config: feature degraded", "switch", names[i])
		}
	}
	return s
}

// field returns c's field of switch sw.
func (c *Config) field(sw Switch) *bool {
	return [switchCount]*bool{&c.ClaimsList, &c.GrabCache, &c.Relay, &c.WalletFlow, &c.Booking, &c.CouponIssue, &c.TokenRestore}[sw]
}

// byName returns the switch called name (names). Errors: an unknown name,
// listing the known ones.
func byName(name string) (Switch, error) {
	for i, n := range names {
		if n == name {
			return Switch(i), nil
		}
	}
	return 0, fmt.Errorf("unknown degrade switch %q (%s)", name, strings.Join(names[:], ", "))
}

// TurnOff switches the feature called name off in c (REDCELL_DEGRADE lists
// such names). Errors: an unknown name.
func (c *Config) TurnOff(name string) error {
	sw, err := byName(name)
	if err == nil {
		*c.field(sw) = true
	}
	return err
}

// UnmarshalYAML reads a config file's degrade section, a mapping of switch
// names to "on" or "off" (YAML's booleans true and false are taken as well);
// a switch left out keeps its value. Errors: an unknown switch, another value.
func (c *Config) UnmarshalYAML(n *yaml.Node) error {
	var m map[string]string
	if err := n.Decode(&m); err != nil {
		return err
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the first error is the same at every load
	for _, name := range keys {
		sw, err := byName(name)
		if err != nil {
			return err
		}
		switch v := m[name]; v {
		case on, "true", "": // "relay:" with no value: on, as it was
			*c.field(sw) = false
		case off, "false":
			*c.field(sw) = true
		default:
			return fmt.Errorf("cell.degrade.%s must be on or off, got %q", name, v)
		}
	}
	return nil
}

// Off reports whether the feature is switched off now.
func (s *Switches) Off(sw Switch) bool { return s.off[sw].Load() }

// Setting returns every switch as it is now ("on" or "off").
func (s *Switches) Setting() api.DegradeSetting {
	state := func(sw Switch) string {
		if s.Off(sw) {
			return off
		}
		return on
	}
	return api.DegradeSetting{ClaimsList: state(ClaimsList), GrabCache: state(GrabCache), Relay: state(Relay),
		WalletFlow: state(WalletFlow), Booking: state(Booking), CouponIssue: state(CouponIssue),
		TokenRestore: state(TokenRestore)}
}

// Set switches the features d names ("on" or "off") and keeps those it
// leaves empty. Nothing changes unless every value is valid. Each change is
// logged (a warning when a feature goes off) and takes effect for the
// requests and relay passes that start after it. Errors: ErrInvalidArgument.
func (s *Switches) Set(d api.DegradeSetting) error {
	values := [switchCount]string{d.ClaimsList, d.GrabCache, d.Relay, d.WalletFlow, d.Booking, d.CouponIssue, d.TokenRestore}
	for i, v := range values {
		if v != "" && v != on && v != off {
			return model.Invalidf("%s must be \"on\" or \"off\", got %q", names[i], v)
		}
	}
	for i, v := range values {
		if v == "" {
			continue
		}
		o := v == off
		if s.off[i].Swap(o) == o {
			continue
		}
		if o {
			s.log.Warn("degrade switch turned off: feature degraded", "switch", names[i])
		} else {
			s.log.Info("degrade switch turned on: feature restored", "switch", names[i])
		}
	}
	return nil
}

// Collector is redcell_degrade_switch{switch}: 1 while that feature is
// switched off (degraded), 0 while it works; read at each scrape.
func (s *Switches) Collector() prometheus.Collector {
	return collector{s: s, desc: prometheus.NewDesc("redcell_degrade_switch",
		"1 while a feature is switched off (degraded) through the admin API or the config, by switch (claims_list, grab_cache, relay, wallet_flow, booking, coupon_issue, token_restore).",
		[]string{"switch"}, nil)}
}

type collector struct {
	s    *Switches
	desc *prometheus.Desc
}

func (c collector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c collector) Collect(ch chan<- prometheus.Metric) {
	for i, name := range names {
		v := 0.0
		if c.s.Off(Switch(i)) {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, name)
	}
}
