package activity

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// warnings lists the keys f holds that load but do nothing.
func (f *File) warnings() []string {
	var ws []string
	for i, p := range f.Activities {
		for j, c := range p.Children {
			for k, r := range c.Rewards {
				for l, sc := range r.Scenes {
					if sc.Compensate != nil {
						ws = append(ws, fmt.Sprintf("activities[%d].children[%d].rewards[%d].scenes[%d].compensate: no longer read, remove it "+
							"(every booking is retried until it is booked)", i, j, k, l))
					}
				}
			}
		}
	}
	return ws
}

// Problems is every problem Validate found, each "where: what".
type Problems []string

func (p Problems) Error() string {
	return "invalid configuration: " + strings.Join(p, "; ")
}

// Validate checks the whole tree and returns Problems, or nil.
func (f *File) Validate() error {
	var ps Problems
	bad := func(where, format string, args ...any) { ps = append(ps, where+": "+fmt.Sprintf(format, args...)) }
	if len(f.Activities) == 0 {
		bad("activities", "no activity")
	}
	parents, children, scenes := map[string]string{}, map[string]string{}, map[string]string{}
	for i := range f.Activities {
		p := &f.Activities[i]
		for j := range p.Children {
			parseWindow(&p.Children[j], fmt.Sprintf("activities[%d].children[%d]", i, j), bad)
		}
	}
	for i, p := range f.Activities {
		pw := fmt.Sprintf("activities[%d]", i)
		if err := ValidateID(p.ID); err != nil {
			bad(pw+".id", "%v", err)
		} else if other, dup := parents[p.ID]; dup {
			bad(pw+".id", "%q is also %s", p.ID, other)
		} else {
			parents[p.ID] = pw
		}
		if len(p.Children) == 0 {
			bad(pw, "no child activity")
		}
		for j, c := range p.Children {
			cw := fmt.Sprintf("%s.children[%d]", pw, j)
			validateChild(c, cw, children, scenes, bad)
			for k := range j {
				if o := p.Children[k]; overlap(c, o) {
					bad(cw, "its window %s overlaps that of children[%d] (%s): a request's time must pick one child", window(c), k, window(o))
				}
			}
		}
	}
	if len(ps) > 0 {
		return ps
	}
	return nil
}

// parseWindow reads a child's start and end (RFC 3339 with an offset).
func parseWindow(c *Child, cw string, bad func(where, format string, args ...any)) {
	for _, e := range []struct {
		raw, name string
		into      **time.Time
	}{{c.StartRaw, "start", &c.Start}, {c.EndRaw, "end", &c.End}} {
		if e.raw == "" {
			continue
		}
		v, err := time.Parse(time.RFC3339, e.raw)
		if err != nil {
			bad(cw+"."+e.name, "%q is no RFC 3339 time with a zone (e.g. 2027-01-31T20:00:00+08:00)", e.raw)
			continue
		}
		*e.into = &v
	}
}

// validateChild checks one child; seen holds the child IDs so far, scenes the
// scene IDs so far by stage (a reward's order number names the scene and the
// stage, not the activity: a scene ID is one scene per stage in the file).
func validateChild(c Child, cw string, seen, scenes map[string]string, bad func(where, format string, args ...any)) {
	if err := ValidateID(c.ID); err != nil {
		bad(cw+".id", "%v", err)
	} else if other, dup := seen[c.ID]; dup {
		bad(cw+".id", "%q is also %s", c.ID, other)
	} else {
		seen[c.ID] = cw
	}
	if !slices.Contains(Stages, c.Stage) {
		bad(cw+".stage", "unknown stage %q (test, gray, official)", c.Stage)
	}
	if c.Start != nil && c.End != nil && !c.End.After(*c.Start) {
		bad(cw, "end %s is not after start %s", c.End.Format(time.RFC3339), c.Start.Format(time.RFC3339))
	}
	if len(c.Rewards) == 0 {
		bad(cw, "no reward")
	}
	rewards := map[string]bool{}
	for k, r := range c.Rewards {
		rw := fmt.Sprintf("%s.rewards[%d]", cw, k)
		if err := ValidateID(r.ID); err != nil {
			bad(rw+".id", "%v", err)
		} else if rewards[r.ID] {
			bad(rw+".id", "%q twice in %s", r.ID, cw)
		}
		rewards[r.ID] = true
		if len(r.Scenes) == 0 {
			bad(rw, "no scene")
		}
		for l, s := range r.Scenes {
			sw := fmt.Sprintf("%s.scenes[%d]", rw, l)
			if err := ValidateID(s.ID); err != nil {
				bad(sw+".id", "%v", err)
			} else if other, dup := scenes[string(c.Stage)+"/"+s.ID]; dup {
				bad(sw+".id", "%q is also %s in stage %s: a reward's order number names the scene and the stage only", s.ID, other, c.Stage)
			} else {
				scenes[string(c.Stage)+"/"+s.ID] = sw
			}
			validateScene(s, sw, bad)
		}
	}
}

func validateScene(s Scene, sw string, bad func(where, format string, args ...any)) {
	if err := ValidateID(s.AwardType); err != nil {
		bad(sw+".award_type", "%v", err)
	}
	if s.Amount.Min < 1 || s.Amount.Max < s.Amount.Min {
		bad(sw+".amount", "min %d and max %d: want 1 <= min <= max", s.Amount.Min, s.Amount.Max)
	}
	if s.AwardType == AwardCash {
		if s.Budget < 1 {
			bad(sw+".budget", "a cash scene needs a budget in cents >= 1, got %d", s.Budget)
		}
		if s.Stock != 0 || s.TemplateID != "" {
			bad(sw, "a cash scene has a budget, not a stock or a template_id")
		}
		if s.Budget >= 1 && s.Amount.Max > s.Budget {
			bad(sw+".amount", "max %d is above the budget %d", s.Amount.Max, s.Budget)
		}
	} else if s.AwardType != "" {
		if s.Stock < 1 {
			bad(sw+".stock", "a %s scene needs a stock >= 1, got %d", s.AwardType, s.Stock)
		}
		if s.Budget != 0 {
			bad(sw, "a %s scene has a stock, not a budget", s.AwardType)
		}
		if s.Stock >= 1 && s.Amount.Max > s.Stock {
			bad(sw+".amount", "max %d is above the stock %d", s.Amount.Max, s.Stock)
		}
		if err := ValidateID(s.TemplateID); err != nil {
			bad(sw+".template_id", "a %s scene names its coupon template: %v", s.AwardType, err)
		}
	}
	if r := s.RateLimit; r.PerSec < 1 || r.Burst < 1 || r.PerSec > RatePerSecMax {
		bad(sw+".rate_limit", "per_sec and burst must be >= 1, per_sec at most %d, got %+v", RatePerSecMax, r)
	} else if r.Burst/r.PerSec > RateBurstSecsMax {
		bad(sw+".rate_limit", "burst %d is more than %d s of per_sec %d", r.Burst, RateBurstSecsMax, r.PerSec)
	}
	if s.PayInto != PayIntoWallet {
		bad(sw+".pay_into", "unknown account %q (wallet)", s.PayInto)
	}
	if p := s.ReservePercent; p != nil {
		if *p < 0 || *p > ReservePercentMax {
			bad(sw+".reserve_percent", "must be 0..%d, got %d", ReservePercentMax, *p)
		}
		if !s.ControlStock {
			bad(sw+".reserve_percent", "only a scene with control_stock: true holds a reserve back")
		}
	}
}

// ValidateID checks an ID of the tree: 1..IDMax characters of [A-Za-z0-9-]
// (no '_': order numbers are joined with it).
func ValidateID(s string) error {
	if len(s) == 0 || len(s) > IDMax {
		return fmt.Errorf("must be 1..%d characters, got %d", IDMax, len(s))
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("%q may hold only ASCII letters, digits and '-'", s)
		}
	}
	return nil
}

// overlap reports whether two children's windows share an instant.
func overlap(a, b Child) bool {
	// [aS, aE) and [bS, bE) overlap when aS < bE and bS < aE; nil is open.
	before := func(x, y *time.Time) bool { return x == nil || y == nil || x.Before(*y) }
	return before(a.Start, b.End) && before(b.Start, a.End)
}

func window(c Child) string {
	s, e := "-∞", "+∞"
	if c.Start != nil {
		s = c.Start.UTC().Format(time.RFC3339)
	}
	if c.End != nil {
		e = c.End.UTC().Format(time.RFC3339)
	}
	return "[" + s + ", " + e + ")"
}
