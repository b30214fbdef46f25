// Package rules is the router's table of degrade switches and anti-abuse
// rules, read from one YAML file (router.rules_file) that every router of a
// cluster reads, reloaded on the admin port (POST /admin/rules/reload) and
// when the file changes.
//
// Both come from the red-envelope front ends of a Spring Festival: a switch
// in front of each back-end call drops a set fraction of its requests, so
// that the front protects the back (a fraction of 0 closes the module), and
// the access layer refuses abusive callers by rules on their IP, account and
// headers before they cost anything further in.
//
// The file:
//
//	admit:            # per route name: percent of its requests let through
//	  open: 50        # half of the opens answer 503 DEGRADED; 0 closes the route
//	retry_after: 5    # seconds a degraded answer asks clients to wait (default 5)
//	rules:            # in order; the first rule that matches a request decides
//	  - name: scraper
//	    header: User-Agent
//	    pattern: "(?i)python-requests"
//	    action: block                 # 403 BLOCKED
//	  - name: one-subnet
//	    ips: ["203.0.113.0/24"]
//	    action: limit                 # 429 USER_RATE_LIMITED past the bucket
//	    limit: {per_sec: 5, burst: 10, by: ip}
//
// A rule matches when every condition it names holds: the client address in
// one of ips (CIDRs or single addresses), the request's act_id in act_ids,
// the header's value (empty when absent) matched by pattern (RE2), the route
// in routes (route names; none: every route). A rule with no condition is
// refused: it would match everything. A limit by act_id matches only
// requests with an act_id (it has nothing to count the others by).
package rules

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"regexp"
	"slices"
	"sync/atomic"
	"time"

	"redcell/internal/yamlfile"
	"redcell/model"
)

// File is the rules file's YAML.
type File struct {
	// Admit is the degrade switch of each route: the percent of its requests
	// let through, 0..100; a route left out lets all through.
	Admit map[string]int `yaml:"admit"`
	// RetryAfter is the Retry-After of a degraded answer, seconds (0: 5).
	RetryAfter int    `yaml:"retry_after"`
	Rules      []Rule `yaml:"rules"`
}

// Rule is one anti-abuse rule.
type Rule struct {
	Name    string   `yaml:"name"`
	IPs     []string `yaml:"ips"`
	ActIDs  []string `yaml:"act_ids"`
	Header  string   `yaml:"header"`
	Pattern string   `yaml:"pattern"`
	Routes  []string `yaml:"routes"`
	// Action is "block" (403 BLOCKED) or "limit" (Limit's bucket; 429
	// USER_RATE_LIMITED past it).
	Action string `yaml:"action"`
	Limit  *Limit `yaml:"limit"`
}

// Limit is a limit rule's token bucket, one per client address (by: ip, the
// default) or per act_id (by: act_id), shared by the routers through
// memcached when they have it.
type Limit struct {
	PerSec int    `yaml:"per_sec"`
	Burst  int    `yaml:"burst"`
	By     string `yaml:"by"`
}

// Bucket is a limit rule's token buckets (climit.Buckets): Allow takes one
// token of key's and says how long until the next when there is none.
type Bucket interface {
	Allow(key string) (bool, time.Duration)
}

// NewBucket makes the buckets of a limit rule named rule.
type NewBucket func(rule string, perSec, burst int) (Bucket, error)

// Request is what the rules look at.
type Request struct {
	Route  int        // index into the route names Compile was given
	IP     netip.Addr // the client's address (invalid: unknown, matches no ips)
	ActID  string     // "" when the route has none
	Header func(name string) []byte
}

// Verdict is a table's answer.
type Verdict uint8

const (
	Pass     Verdict = iota // go on
	Degraded                // dropped by the route's degrade switch: 503 DEGRADED
	Blocked                 // a block rule matched: 403 BLOCKED
	Limited                 // a limit rule's bucket is empty: 429 USER_RATE_LIMITED
)

// Table is a compiled rules file. Safe for concurrent use; immutable but for
// its counters.
type Table struct {
	Version    string // the file's content (yamlfile.Version), "" for the empty table
	admit      []int  // by route index, 0..100
	retryAfter int
	rules      []*rule
	degraded   []atomic.Int64 // by route index
	idle       bool           // no rule, every route at 100 % (Idle)
}

type rule struct {
	Rule
	prefixes []netip.Prefix
	acts     map[string]bool
	pattern  *regexp.Regexp
	routes   []bool // by route index; nil: all
	bucket   Bucket
	byAct    bool
	hits     atomic.Int64 // requests the rule refused
}

// Empty is the table of no file: everything passes.
func Empty(routes int) *Table {
	t := &Table{admit: make([]int, routes), retryAfter: 5, degraded: make([]atomic.Int64, routes), idle: true}
	for i := range t.admit {
		t.admit[i] = 100
	}
	return t
}

// Parse decodes and compiles a rules file. routeNames are the route names by
// index ("" where a route takes no rules); newBucket makes limit rules'
// buckets. Errors name the rule or route at fault.
func Parse(b []byte, routeNames []string, newBucket NewBucket) (*Table, error) {
	var f File
	if err := yamlfile.Decode(b, &f, "rules", "rules table"); err != nil {
		return nil, err
	}
	t := Empty(len(routeNames))
	t.Version = yamlfile.Version(b)
	index := map[string]int{}
	for i, n := range routeNames {
		if n != "" {
			index[n] = i
		}
	}
	known := func() []string {
		out := make([]string, 0, len(index))
		for n := range index {
			out = append(out, n)
		}
		slices.Sort(out)
		return out
	}
	for name, pct := range f.Admit {
		i, ok := index[name]
		if !ok {
			return nil, fmt.Errorf("admit: unknown route %q (routes: %v)", name, known())
		}
		if pct < 0 || pct > 100 {
			return nil, fmt.Errorf("admit: %s is %d, want a percent 0..100", name, pct)
		}
		t.admit[i] = pct
	}
	if f.RetryAfter < 0 || f.RetryAfter > 3600 {
		return nil, fmt.Errorf("retry_after is %d, want 0..3600 seconds", f.RetryAfter)
	}
	if f.RetryAfter > 0 {
		t.retryAfter = f.RetryAfter
	}
	names := map[string]bool{}
	for i, r := range f.Rules {
		c, err := compile(r, index, known, newBucket)
		if err != nil {
			return nil, fmt.Errorf("rule %d (%q): %w", i+1, r.Name, err)
		}
		if names[r.Name] {
			return nil, fmt.Errorf("rule %d: the name %q is taken by an earlier rule", i+1, r.Name)
		}
		names[r.Name] = true
		t.rules = append(t.rules, c)
	}
	t.idle = len(t.rules) == 0 && !slices.ContainsFunc(t.admit, func(p int) bool { return p < 100 })
	return t, nil
}

var ruleName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// compile checks one rule of the file and makes what Check matches with:
// its name, then its conditions (at least one), then its action. index
// gives each route name's index; known lists the names for an error.
func compile(r Rule, index map[string]int, known func() []string, newBucket NewBucket) (*rule, error) {
	if !ruleName.MatchString(r.Name) {
		return nil, fmt.Errorf("name must be 1-63 of [a-z0-9_-], starting with a letter or digit")
	}
	c := &rule{Rule: r}
	if err := c.compileIPs(); err != nil {
		return nil, err
	}
	if err := c.compileActIDs(); err != nil {
		return nil, err
	}
	if err := c.compilePattern(); err != nil {
		return nil, err
	}
	if err := c.compileRoutes(index, known); err != nil {
		return nil, err
	}
	if len(c.prefixes) == 0 && c.acts == nil && c.pattern == nil && c.routes == nil {
		return nil, fmt.Errorf("a rule needs a condition (ips, act_ids, header and pattern, routes): this one would match every request")
	}
	if err := c.compileAction(newBucket); err != nil {
		return nil, err
	}
	return c, nil
}

// compileIPs parses the rule's ips, each a CIDR or an address, into
// c.prefixes.
func (c *rule) compileIPs() error {
	for _, s := range c.IPs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return fmt.Errorf("ips: %q is neither a CIDR nor an address", s)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		// The client's address is compared unmapped (an IPv4 client on an
		// IPv6 socket is its IPv4 address): so is an IPv4-mapped prefix,
		// which would otherwise match nothing.
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		c.prefixes = append(c.prefixes, p.Masked())
	}
	return nil
}

// compileActIDs checks the rule's act_ids and sets c.acts (nil when it
// names none).
func (c *rule) compileActIDs() error {
	if len(c.ActIDs) > 0 {
		c.acts = map[string]bool{}
		for _, a := range c.ActIDs {
			// The router sees only valid act_ids: any other (an empty one
			// would match every request without an act_id) is a mistake.
			if err := model.ValidateActID(a); err != nil {
				return fmt.Errorf("act_ids: %q: %w", a, err)
			}
			c.acts[a] = true
		}
	}
	return nil
}

// compilePattern checks that header and pattern go together and compiles
// the pattern into c.pattern.
func (c *rule) compilePattern() error {
	if (c.Header == "") != (c.Pattern == "") {
		return fmt.Errorf("header and pattern go together")
	}
	if c.Pattern != "" {
		re, err := regexp.Compile(c.Pattern)
		if err != nil {
			return fmt.Errorf("pattern: %w", err)
		}
		c.pattern = re
	}
	return nil
}

// compileRoutes turns the rule's route names into c.routes, by route index
// (nil when it names none).
func (c *rule) compileRoutes(index map[string]int, known func() []string) error {
	if len(c.Routes) > 0 {
		c.routes = make([]bool, len(index)+1)
		for _, n := range c.Routes {
			i, ok := index[n]
			if !ok {
				return fmt.Errorf("routes: unknown route %q (routes: %v)", n, known())
			}
			if i >= len(c.routes) {
				c.routes = append(c.routes, make([]bool, i+1-len(c.routes))...)
			}
			c.routes[i] = true
		}
	}
	return nil
}

// compileAction checks the rule's action and, for a limit rule, its limit,
// and makes the limit's buckets with newBucket.
func (c *rule) compileAction(newBucket NewBucket) error {
	switch c.Action {
	case "block":
		if c.Limit != nil {
			return fmt.Errorf("a block rule takes no limit")
		}
	case "limit":
		l := c.Limit
		if l == nil || l.PerSec < 1 || l.Burst < 1 {
			return fmt.Errorf("a limit rule needs limit.per_sec >= 1 and limit.burst >= 1")
		}
		switch l.By {
		case "", "ip":
		case "act_id":
			c.byAct = true
		default:
			return fmt.Errorf("limit.by is %q, want ip or act_id", l.By)
		}
		b, err := newBucket(c.Name, l.PerSec, l.Burst)
		if err != nil {
			return err
		}
		c.bucket = b
	default:
		return fmt.Errorf("action is %q, want block or limit", c.Action)
	}
	return nil
}

func (r *rule) matches(q *Request) bool {
	if r.routes != nil && (q.Route >= len(r.routes) || !r.routes[q.Route]) {
		return false
	}
	if r.prefixes != nil {
		if !q.IP.IsValid() || !slices.ContainsFunc(r.prefixes, func(p netip.Prefix) bool { return p.Contains(q.IP.Unmap()) }) {
			return false
		}
	}
	if r.acts != nil && !r.acts[q.ActID] {
		return false
	}
	if r.byAct && q.ActID == "" {
		return false // nothing to count by: the rules after it decide
	}
	if r.pattern != nil && !r.pattern.Match(q.Header(r.Header)) {
		return false
	}
	return true
}

// Check runs q through the table: the route's degrade switch, then the
// rules in order (the first that matches decides). It returns the verdict,
// the rule that decided ("" for the switch or a pass) and the Retry-After in
// seconds for a refusal.
func (t *Table) Check(q *Request) (v Verdict, ruleName string, retryAfter int) {
	if pct := t.admit[q.Route]; pct < 100 && (pct == 0 || rand.IntN(100) >= pct) {
		t.degraded[q.Route].Add(1)
		return Degraded, "", t.retryAfter
	}
	for _, r := range t.rules {
		if !r.matches(q) {
			continue
		}
		if r.bucket == nil {
			r.hits.Add(1)
			return Blocked, r.Name, 0
		}
		key := q.IP.String()
		if r.byAct {
			key = q.ActID // not "": matches
		}
		ok, wait := r.bucket.Allow(key)
		if ok {
			return Pass, "", 0
		}
		r.hits.Add(1)
		return Limited, r.Name, max(1, int((wait+time.Second-1)/time.Second))
	}
	return Pass, "", 0
}

// Idle reports whether the table lets everything through unseen: no rule and
// every route fully admitted (the router then skips Check).
// It is decided once, when the table is made: the router asks on every
// request.
func (t *Table) Idle() bool { return t.idle }

// Summary is a table as the admin port shows it.
type Summary struct {
	Version    string         `json:"version"`
	Admit      map[string]int `json:"admit"`         // routes not at 100 %
	Degraded   map[string]int `json:"degraded"`      // requests dropped per route since the load
	RetryAfter int            `json:"retry_after_s"` // of a degraded answer
	Rules      []RuleSummary  `json:"rules"`
}

// RuleSummary is one rule and the requests it refused since the load.
type RuleSummary struct {
	Name    string `json:"name"`
	Action  string `json:"action"`
	Refused int64  `json:"refused"`
}

// Summary describes t; routeNames as given to Parse.
func (t *Table) Summary(routeNames []string) Summary {
	s := Summary{Version: t.Version, Admit: map[string]int{}, Degraded: map[string]int{}, RetryAfter: t.retryAfter, Rules: []RuleSummary{}}
	for i, p := range t.admit {
		if p < 100 && routeNames[i] != "" {
			s.Admit[routeNames[i]] = p
		}
		if n := t.degraded[i].Load(); n > 0 {
			s.Degraded[routeNames[i]] = int(n)
		}
	}
	for _, r := range t.rules {
		s.Rules = append(s.Rules, RuleSummary{Name: r.Name, Action: r.Action, Refused: r.hits.Load()})
	}
	return s
}
