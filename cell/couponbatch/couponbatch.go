// Package couponbatch is the coupon batches' configuration: a YAML file the
// operator edits, as Douyin Pay set up its Spring Festival coupon drop. A
// batch (its stock ID) has a total stock, a validity window, a face value in
// cents and a per-person limit, and may belong to a batch group: a person
// who holds a coupon of any batch of a group gets no coupon of another batch
// of that group. The file also holds the built-in risk rules, caps per
// device, per client IP and per act_id per minute over what the calling app
// reports.
//
// Load parses and validates a file; a Catalog is immutable once loaded, so
// a reload swaps it whole (Holder) and one request uses one catalog from
// start to end. A reload that sets a batch's stock below what it has issued
// already is refused (CheckIssued).
package couponbatch

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.yaml.in/yaml/v3"

	"redcell/internal/yamlfile"
)

// IDMax bounds a batch or group ID.
const IDMax = 32

// FaceValueMax bounds a coupon's face value: 100,000.00 CNY in cents.
const FaceValueMax = 10_000_000

// StockMax bounds a batch's stock.
const StockMax = 1_000_000_000_000

// LimitMax bounds the per-person limit.
const LimitMax = 1000

// File is the YAML file.
type File struct {
	Batches []Batch   `yaml:"batches"`
	Risk    RiskRules `yaml:"risk"`
}

// Batch is one coupon batch (a stock ID).
type Batch struct {
	// ID is the stock ID: 1..IDMax characters of [A-Za-z0-9-].
	ID   string `yaml:"id"`
	Name string `yaml:"name"`
	// Stock is how many coupons the batch issues in all.
	Stock int64 `yaml:"stock"`
	// FaceValue is one coupon's value, cents.
	FaceValue int64 `yaml:"face_value"`
	// PerPersonLimit is how many coupons of the batch one act_id may hold.
	PerPersonLimit int `yaml:"per_person_limit"`
	// Group is the batch group ("" none): one batch of a group per person.
	Group string `yaml:"group"`
	// StartRaw and EndRaw bound when the batch issues, [start, end), RFC
	// 3339 with an offset; absent start: always begun, absent end: never
	// ends.
	StartRaw string `yaml:"start"`
	EndRaw   string `yaml:"end"`

	Start, End *time.Time `yaml:"-"` // parsed by Validate; never changed after
}

// RiskRules are the built-in risk check's caps: coupon requests accepted per
// minute per device ID, per client IP and per act_id. Zero takes the
// default; a request without a device ID or an IP is not counted under it.
type RiskRules struct {
	PerDevicePerMin int `yaml:"per_device_per_min"`
	PerIPPerMin     int `yaml:"per_ip_per_min"`
	PerActPerMin    int `yaml:"per_act_per_min"`
}

// Default risk caps: generous, so that only scripted traffic meets them (a
// person taking a coupon a second for a minute is far above any drop's
// pace; an IP may be a carrier's NAT for many people).
const (
	DefaultPerDevicePerMin = 60
	DefaultPerIPPerMin     = 6000
	DefaultPerActPerMin    = 60
)

// WithDefaults returns r with its zero caps set to the defaults.
func (r RiskRules) WithDefaults() RiskRules {
	if r.PerDevicePerMin == 0 {
		r.PerDevicePerMin = DefaultPerDevicePerMin
	}
	if r.PerIPPerMin == 0 {
		r.PerIPPerMin = DefaultPerIPPerMin
	}
	if r.PerActPerMin == 0 {
		r.PerActPerMin = DefaultPerActPerMin
	}
	return r
}

// Errors of Catalog.Open.
var (
	ErrUnknownBatch = errors.New("couponbatch: unknown batch")
	ErrNotStarted   = errors.New("couponbatch: the batch does not issue yet")
	ErrEnded        = errors.New("couponbatch: the batch no longer issues")
)

// Catalog is a loaded, valid file. Safe for concurrent use: never changed
// after Parse.
type Catalog struct {
	batches map[string]*Batch
	order   []string  // batch IDs as in the file
	Risk    RiskRules // with the defaults set
	Version string    // the first 12 hex digits of the file's SHA-256
	Loaded  time.Time
	Path    string
}

// Load reads, parses and validates the file at path (Parse).
func Load(path string, now time.Time) (*Catalog, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("couponbatch: %w", err)
	}
	c, err := Parse(b, now)
	if err != nil {
		return nil, fmt.Errorf("couponbatch: %s: %w", path, err)
	}
	c.Path = path
	return c, nil
}

// Parse decodes a file (unknown keys refused, one document) and validates
// it; the error lists every problem found (Problems).
func Parse(b []byte, now time.Time) (*Catalog, error) {
	var f File
	if err := yamlfile.Decode(b, &f, "coupon batches", "catalog"); err != nil {
		return nil, err
	}
	if err := integersOnly(b); err != nil {
		return nil, err
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	c := &Catalog{batches: map[string]*Batch{}, Risk: f.Risk.WithDefaults(), Version: yamlfile.Version(b), Loaded: now}
	for i := range f.Batches {
		bt := &f.Batches[i]
		c.batches[bt.ID] = bt
		c.order = append(c.order, bt.ID)
	}
	return c, nil
}

// intFields are the keys whose values must be written as integers: the
// YAML decoder would read 4.99 into an int64 field as 4, and a face value
// written in yuan instead of cents must be refused, not truncated.
var intFields = map[string]bool{"stock": true, "face_value": true, "per_person_limit": true,
	"per_device_per_min": true, "per_ip_per_min": true, "per_act_per_min": true}

// integersOnly refuses a file where a key of intFields has a value that is
// not an integer (a float, a string, ...), naming each.
func integersOnly(b []byte) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("not a valid coupon batches file: %w", err)
	}
	var ps Problems
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		if n.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				if intFields[k.Value] && (v.Kind != yaml.ScalarNode || v.ShortTag() != "!!int") {
					ps = append(ps, fmt.Sprintf("line %d: %s: %q is not an integer (amounts are whole cents)", v.Line, k.Value, v.Value))
				}
			}
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(&doc)
	if len(ps) > 0 {
		return ps
	}
	return nil
}

// Problems is every problem Validate found, each "where: what".
type Problems []string

func (p Problems) Error() string {
	return "invalid coupon batches: " + strings.Join(p, "; ")
}

// Validate checks every batch and the risk caps, and returns Problems or
// nil. It parses the windows into Start and End.
func (f *File) Validate() error {
	var ps Problems
	bad := func(where, format string, args ...any) { ps = append(ps, where+": "+fmt.Sprintf(format, args...)) }
	if len(f.Batches) == 0 {
		bad("batches", "no batch")
	}
	seen := map[string]string{}
	for i := range f.Batches {
		b := &f.Batches[i]
		w := fmt.Sprintf("batches[%d]", i)
		if err := ValidateID(b.ID); err != nil {
			bad(w+".id", "%v", err)
		} else if other, dup := seen[b.ID]; dup {
			bad(w+".id", "%q is also %s", b.ID, other)
		} else {
			seen[b.ID] = w
		}
		if b.Stock < 1 || b.Stock > StockMax {
			bad(w+".stock", "%d: want 1..%d coupons", b.Stock, int64(StockMax))
		}
		if b.FaceValue < 1 || b.FaceValue > FaceValueMax {
			bad(w+".face_value", "%d: want 1..%d cents", b.FaceValue, FaceValueMax)
		}
		if b.PerPersonLimit < 1 || b.PerPersonLimit > LimitMax {
			bad(w+".per_person_limit", "%d: want 1..%d coupons per act_id", b.PerPersonLimit, LimitMax)
		}
		if b.Group != "" {
			if err := ValidateID(b.Group); err != nil {
				bad(w+".group", "%v", err)
			}
		}
		for _, e := range []struct {
			raw, name string
			into      **time.Time
		}{{b.StartRaw, "start", &b.Start}, {b.EndRaw, "end", &b.End}} {
			if e.raw == "" {
				continue
			}
			v, err := time.Parse(time.RFC3339, e.raw)
			if err != nil {
				bad(w+"."+e.name, "%q is no RFC 3339 time with a zone (e.g. 2027-01-31T20:00:00+08:00)", e.raw)
				continue
			}
			*e.into = &v
		}
		if b.Start != nil && b.End != nil && !b.End.After(*b.Start) {
			bad(w, "end %s is not after start %s", b.End.Format(time.RFC3339), b.Start.Format(time.RFC3339))
		}
	}
	for _, r := range []struct {
		name string
		v    int
	}{{"per_device_per_min", f.Risk.PerDevicePerMin}, {"per_ip_per_min", f.Risk.PerIPPerMin}, {"per_act_per_min", f.Risk.PerActPerMin}} {
		if r.v < 0 {
			bad("risk."+r.name, "%d: want 0 (the default) or a cap >= 1", r.v)
		}
	}
	if len(ps) > 0 {
		return ps
	}
	return nil
}

// ValidateID checks a batch or group ID: 1..IDMax characters of
// [A-Za-z0-9-].
func ValidateID(s string) error {
	if len(s) == 0 || len(s) > IDMax {
		return fmt.Errorf("%q: an ID is 1..%d characters", s, IDMax)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("%q: an ID holds only ASCII letters, digits and '-'", s)
		}
	}
	return nil
}

// Batch returns a copy of batch id; ok is false when there is none.
func (c *Catalog) Batch(id string) (b Batch, ok bool) {
	p := c.batches[id]
	if p == nil {
		return Batch{}, false
	}
	return *p, true
}

// Batches returns a copy of every batch, in the file's order.
func (c *Catalog) Batches() []Batch {
	out := make([]Batch, 0, len(c.order))
	for _, id := range c.order {
		out = append(out, *c.batches[id])
	}
	return out
}

// Open returns a copy of batch id if it issues at time at. Errors:
// ErrUnknownBatch, ErrNotStarted, ErrEnded.
func (c *Catalog) Open(id string, at time.Time) (Batch, error) {
	b := c.batches[id]
	switch {
	case b == nil:
		return Batch{}, fmt.Errorf("%w %q", ErrUnknownBatch, id)
	case b.Start != nil && at.Before(*b.Start):
		return Batch{}, fmt.Errorf("%w: %s starts at %s", ErrNotStarted, id, b.Start.Format(time.RFC3339))
	case b.End != nil && !at.Before(*b.End):
		return Batch{}, fmt.Errorf("%w: %s ended at %s", ErrEnded, id, b.End.Format(time.RFC3339))
	}
	return *b, nil
}

// Issued tells how many coupons a batch has issued so far (written off
// included), for a reload's check.
type Issued func(batch string) int64

// CheckIssued refuses a catalog in which a batch's stock is below what it
// has issued (nil issued checks nothing), and, against the catalog loaded
// before (old, nil: none), one that drops a batch that has issued (its
// coupons would have no batch), moves it to another group or lowers its
// per-person limit.
func (c *Catalog) CheckIssued(issued Issued, old *Catalog) error {
	if issued == nil {
		return nil
	}
	var ps Problems
	for _, id := range c.order {
		n := issued(id)
		if n > c.batches[id].Stock {
			ps = append(ps, fmt.Sprintf("batch %s: stock %d is below the %d coupons issued already", id, c.batches[id].Stock, n))
		}
		if old == nil || n == 0 {
			continue
		}
		// Holdings are read from the coupons as issued: a batch that has
		// issued keeps its group, and its limit may only grow, or people
		// could hold two batches of a group or more than the limit.
		if was := old.batches[id]; was != nil {
			if was.Group != c.batches[id].Group {
				ps = append(ps, fmt.Sprintf("batch %s: group %q -> %q after %d coupons were issued", id, was.Group, c.batches[id].Group, n))
			}
			if c.batches[id].PerPersonLimit < was.PerPersonLimit {
				ps = append(ps, fmt.Sprintf("batch %s: per_person_limit %d -> %d after %d coupons were issued: a limit may only grow", id,
					was.PerPersonLimit, c.batches[id].PerPersonLimit, n))
			}
		}
	}
	if old != nil {
		for _, id := range old.order {
			if c.batches[id] == nil && issued(id) > 0 {
				ps = append(ps, fmt.Sprintf("batch %s: dropped, but it has issued %d coupons", id, issued(id)))
			}
		}
	}
	if len(ps) > 0 {
		return ps
	}
	return nil
}

// Holder holds the current catalog; a reload swaps it whole. Safe for
// concurrent use; the zero value holds none.
type Holder struct {
	mu sync.Mutex // serializes reloads
	p  atomic.Pointer[Catalog]
}

// Catalog returns the current catalog, nil when none is loaded.
func (h *Holder) Catalog() *Catalog { return h.p.Load() }

// Reload loads path and, only when it is valid and passes CheckIssued,
// makes it current; otherwise the current catalog stays and the error says
// why.
func (h *Holder) Reload(path string, now time.Time, issued Issued) (*Catalog, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c, err := Load(path, now)
	if err != nil {
		return nil, err
	}
	if err := c.CheckIssued(issued, h.p.Load()); err != nil {
		return nil, fmt.Errorf("couponbatch: %s: %w", path, err)
	}
	h.p.Store(c)
	return c, nil
}
