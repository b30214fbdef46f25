// Package activity is the reward activities' configuration: a tree the
// operator edits as YAML, as Douyin's Spring Festival reward wallet was set
// up. A parent activity (what upstream always names) has child activities,
// each with a time window and a stage (test, gray, official); the child of a
// request is the one whose window holds the request's time, so upstream
// never names a stage. A child has rewards; a reward has scenes; a scene says
// what it pays (award type and amount rule), how much in all (budget in
// cents, or stock in count), how fast (rate limit, for the whole cluster),
// whether stock is controlled and how much of it is held back (reserve
// percent), and which account it pays into.
//
// A scene's "compensate" key is no longer read: every booking is retried
// until it is booked (the booker takes a pending reward again and again), so
// there is nothing to switch. A file that still has it loads, with a warning
// (Tree.Warnings).
//
// Load parses and validates a file; a Tree is immutable once loaded, so a
// reload swaps the whole tree (Holder) and a request uses one tree from start
// to end. Every ID that goes into a reward's order number
// ({actID}_{scene}_{rain}_{award_type}_{stage}) — scene, award type, stage —
// is 1..32 characters of [A-Za-z0-9-], never '_', so the number parses from
// the right; activity and reward IDs follow the same rule.
package activity

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"redcell/internal/yamlfile"
)

// Stage is the stage of a child activity. The reward paths to come key their
// data by it (the stage is the last part of a reward's order number), so
// that each stage's issuance, display and use stay apart.
type Stage string

// The stages, in the order an activity goes through them.
const (
	StageTest     Stage = "test"     // internal test
	StageGray     Stage = "gray"     // gray rehearsal
	StageOfficial Stage = "official" // the night itself: the only stage whose money can be withdrawn
)

// Stages lists every stage, in order.
var Stages = []Stage{StageTest, StageGray, StageOfficial}

// AwardCash is the award type of cash rewards (cents, paid into the wallet);
// any other award type is a coupon kind, recorded as an asset with its
// template ID.
const AwardCash = "cash"

// IDMax bounds every ID of the tree.
const IDMax = 32

// File is the YAML file.
type File struct {
	Activities []Parent `yaml:"activities"`
}

// Parent is a parent activity: upstream names it; the request time picks the
// child.
type Parent struct {
	ID       string  `yaml:"id"`
	Name     string  `yaml:"name"`
	Children []Child `yaml:"children"`
}

// Child is one stage of a parent activity over a time window [Start, End).
// In the file both are RFC 3339 strings with an explicit offset
// ("2027-01-31T20:00:00+08:00"): a date or a time without a zone is refused,
// never read as UTC. An absent start is the beginning of time, an absent end
// never comes.
type Child struct {
	ID       string   `yaml:"id"`
	Stage    Stage    `yaml:"stage"`
	StartRaw string   `yaml:"start"`
	EndRaw   string   `yaml:"end"`
	Rewards  []Reward `yaml:"rewards"`

	Start, End *time.Time `yaml:"-"` // parsed from StartRaw and EndRaw by Validate
}

// Reward groups scenes (one prize of the activity: the rain's cash, a card
// draw, ...).
type Reward struct {
	ID     string  `yaml:"id"`
	Scenes []Scene `yaml:"scenes"`
}

// Scene is where a reward is issued: its rule.
type Scene struct {
	ID string `yaml:"id"`
	// AwardType is AwardCash or a coupon kind ("coupon", "card", ...).
	AwardType string `yaml:"award_type"`
	// TemplateID names the coupon template of a coupon-kind scene (unused
	// for cash).
	TemplateID string `yaml:"template_id"`
	// Amount is the rule the caller's amount must follow: cents for cash,
	// pieces for coupon kinds.
	Amount AmountRule `yaml:"amount"`
	// Budget is the cash a scene may issue in all, cents (cash scenes).
	Budget int64 `yaml:"budget"`
	// Stock is the pieces a coupon-kind scene may issue in all.
	Stock int64 `yaml:"stock"`
	// RateLimit bounds the scene's issues for the whole cluster: over any
	// span T, at most Burst + PerSec·T summed over all cells.
	RateLimit Rate `yaml:"rate_limit"`
	// Compensate is read only to warn that it does nothing (Tree.Warnings):
	// every booking is retried until it is booked, whatever it says, since a
	// reward left unbooked would be money shown to a person and never paid.
	Compensate *bool `yaml:"compensate"`
	// ControlStock: issuing draws down Budget or Stock and stops short of
	// it; false issues without a cap (a scene the operator caps elsewhere).
	ControlStock bool `yaml:"control_stock"`
	// ReservePercent is the part of Budget or Stock, in percent (0..99),
	// held back: issuing stops once what is left of it reaches this (the
	// seed stopped at 10 % of stock left). nil: DefaultReservePercent. Only
	// a scene that controls its stock has one.
	ReservePercent *int `yaml:"reserve_percent"`
	// PayInto is the account the scene pays into: "wallet" (the person's
	// wallet of the child's stage), the only one so far.
	PayInto string `yaml:"pay_into"`
}

// AmountRule bounds the amount of one issue, inclusive.
type AmountRule struct {
	Min int64 `yaml:"min"`
	Max int64 `yaml:"max"`
}

// Rate is a token bucket: PerSec sustained, Burst back to back. The cells
// keep it in memcached (cell/scenelimit), which bounds it: PerSec at most
// RatePerSecMax, Burst at most RateBurstSecsMax seconds of PerSec.
type Rate struct {
	PerSec int `yaml:"per_sec"`
	Burst  int `yaml:"burst"`
}

// Bounds of a scene's rate_limit: a million issues a second (above the
// seed's peak of 1.8 million for all scenes, per scene), a burst of at
// most a day of the rate (the shared bucket lives as long as its burst
// takes to refill).
const (
	RatePerSecMax    = 1_000_000
	RateBurstSecsMax = 86_400
)

// PayIntoWallet is the one account a scene pays into so far.
const PayIntoWallet = "wallet"

// DefaultReservePercent is a scene's reserve when the file sets none: the
// 10 % of stock left at which the seed stopped issuing.
const DefaultReservePercent = 10

// ReservePercentMax bounds reserve_percent: 100 would never issue.
const ReservePercentMax = 99

// Total is what the scene may issue in all: Budget (cash, cents) or Stock
// (coupon kinds, pieces).
func (s *Scene) Total() int64 {
	if s.AwardType == AwardCash {
		return s.Budget
	}
	return s.Stock
}

// Reserve is the part of total (the scene's Total, or a caller's copy of
// it) held back: ReservePercent of it, rounded down, never below 0.
func (s *Scene) Reserve(total int64) int64 {
	pct := int64(DefaultReservePercent)
	if s.ReservePercent != nil {
		pct = int64(*s.ReservePercent)
	}
	if total <= 0 || pct <= 0 {
		return 0
	}
	return total/100*pct + total%100*pct/100 // no overflow for any int64 total
}

// Tree is a loaded, valid configuration. Safe for concurrent use: never
// changed after Parse.
type Tree struct {
	parents map[string]*Parent
	order   []string // parent IDs, as in the file
	// Warnings are what the file holds that loads but does nothing (a
	// scene's compensate), each "where: what"; the cell logs them and the
	// admin port answers them.
	Warnings []string
	Version  string    // the first 12 hex digits of the file's SHA-256
	Loaded   time.Time // when it was loaded
	Path     string    // the file it came from
}

// Load reads, parses and validates the file at path (Parse).
func Load(path string, now time.Time) (*Tree, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("activity: %w", err)
	}
	t, err := Parse(b, now)
	if err != nil {
		return nil, fmt.Errorf("activity: %s: %w", path, err)
	}
	t.Path = path
	return t, nil
}

// Parse decodes a file (unknown keys refused) and validates it. The error
// lists every problem found (Problems), each with its place in the tree.
func Parse(b []byte, now time.Time) (*Tree, error) {
	var f File
	if err := yamlfile.Decode(b, &f, "activities", "tree"); err != nil {
		return nil, err
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	t := &Tree{parents: map[string]*Parent{}, Version: yamlfile.Version(b), Loaded: now, Warnings: f.warnings()}
	for i := range f.Activities {
		p := &f.Activities[i]
		t.parents[p.ID] = p
		t.order = append(t.order, p.ID)
	}
	return t, nil
}

// Errors of Resolve.
var (
	ErrUnknownActivity = errors.New("activity: unknown parent activity")
	ErrNoChild         = errors.New("activity: no child activity at this time")
	ErrUnknownScene    = errors.New("activity: unknown scene")
)

// Active is what a request resolves to: the parent, the child its time picked
// (and so the stage), the reward and the scene.
type Active struct {
	Parent *Parent
	Child  *Child
	Reward *Reward
	Scene  *Scene
}

// Resolve finds the child of parent whose window holds at, and in it scene.
// Errors: ErrUnknownActivity, ErrNoChild (before the first window, after
// the last, or between two), ErrUnknownScene.
func (t *Tree) Resolve(parent, scene string, at time.Time) (Active, error) {
	p := t.parents[parent]
	if p == nil {
		return Active{}, fmt.Errorf("%w %q", ErrUnknownActivity, parent)
	}
	for i := range p.Children {
		c := &p.Children[i]
		if c.Start != nil && at.Before(*c.Start) || c.End != nil && !at.Before(*c.End) {
			continue
		}
		for j := range c.Rewards {
			r := &c.Rewards[j]
			for k := range r.Scenes {
				if r.Scenes[k].ID == scene {
					return Active{Parent: p, Child: c, Reward: r, Scene: &r.Scenes[k]}, nil
				}
			}
		}
		return Active{Parent: p, Child: c}, fmt.Errorf("%w %q in %s (%s)", ErrUnknownScene, scene, c.ID, c.Stage)
	}
	return Active{}, fmt.Errorf("%w: %s has none at %s", ErrNoChild, parent, at.UTC().Format(time.RFC3339))
}

// ChildAt is the child of parent whose window holds at; nil when parent is
// unknown or has none then.
func (t *Tree) ChildAt(parent string, at time.Time) *Child {
	p := t.parents[parent]
	if p == nil {
		return nil
	}
	for i := range p.Children {
		c := &p.Children[i]
		if c.Start != nil && at.Before(*c.Start) || c.End != nil && !at.Before(*c.End) {
			continue
		}
		return c
	}
	return nil
}

// SceneByKey finds the scene "parent/child/scene" (model.BudgetKey names a
// scene's budget so); nil when there is none.
func (t *Tree) SceneByKey(key string) *Scene {
	parent, rest, _ := strings.Cut(key, "/")
	child, scene, _ := strings.Cut(rest, "/")
	p := t.parents[parent]
	if p == nil {
		return nil
	}
	for i := range p.Children {
		c := &p.Children[i]
		if c.ID != child {
			continue
		}
		for j := range c.Rewards {
			for k := range c.Rewards[j].Scenes {
				if c.Rewards[j].Scenes[k].ID == scene {
					return &c.Rewards[j].Scenes[k]
				}
			}
		}
	}
	return nil
}

// ChildOfStage is the first child of parent in stage st; nil when none.
func (t *Tree) ChildOfStage(parent string, st Stage) *Child {
	p := t.parents[parent]
	if p == nil {
		return nil
	}
	for i := range p.Children {
		if p.Children[i].Stage == st {
			return &p.Children[i]
		}
	}
	return nil
}

// Parents returns the parent activities, in the file's order.
func (t *Tree) Parents() []*Parent {
	out := make([]*Parent, 0, len(t.order))
	for _, id := range t.order {
		out = append(out, t.parents[id])
	}
	return out
}

// Issued tells how much a scene has issued so far (cents for cash, pieces for
// coupon kinds), for a reload's check that no budget or stock falls below it.
type Issued func(parent, child, scene string) int64

// CheckIssued refuses a tree in which a scene's budget or stock is below what
// it has issued already (issued: the running counters; nil checks nothing).
func (t *Tree) CheckIssued(issued Issued) error {
	if issued == nil {
		return nil
	}
	var ps Problems
	for _, p := range t.Parents() {
		for _, c := range p.Children {
			for _, r := range c.Rewards {
				for _, s := range r.Scenes {
					limit, what := s.Total(), "budget"
					if s.AwardType != AwardCash {
						what = "stock"
					}
					if n := issued(p.ID, c.ID, s.ID); s.ControlStock && n > limit {
						ps = append(ps, fmt.Sprintf("%s/%s/%s: %s %d is below the %d already issued", p.ID, c.ID, s.ID, what, limit, n))
					}
				}
			}
		}
	}
	if len(ps) > 0 {
		return ps
	}
	return nil
}

// Holder holds the current tree; a reload swaps it whole. Safe for
// concurrent use; the zero value holds none.
type Holder struct {
	mu sync.Mutex // one reload at a time: a slower reload never stores an older file over a newer one
	p  atomic.Pointer[Tree]
}

// Tree returns the current tree, nil when none is loaded.
func (h *Holder) Tree() *Tree { return h.p.Load() }

// Reload loads path and, only when it is valid and passes CheckIssued(issued),
// makes it the current tree; otherwise the current one stays, and the error
// says why.
func (h *Holder) Reload(path string, now time.Time, issued Issued) (*Tree, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	t, err := Load(path, now)
	if err != nil {
		return nil, err
	}
	if err := t.CheckIssued(issued); err != nil {
		return nil, fmt.Errorf("activity: %s: %w", path, err)
	}
	h.p.Store(t)
	return t, nil
}
