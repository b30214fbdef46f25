package router

import (
	"errors"
	"fmt"
	"hash/maphash"
	"sort"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"redcell/api"
	"redcell/internal/climit"
	"redcell/router/apikey"
	"redcell/router/rules"
)

// The router's routes are the public ones of api's table: RouteOther (an
// unknown path or a refused method) and RouteAccount up to, not including,
// api.RouteCredits, the first internal route (a path the router answers 404).
// A route's api.RouteID indexes the rate limiters and the metrics.
const (
	routeOther = api.RouteOther
	routeCount = api.RouteCredits
)

// routeNames are the route label values of the metrics and the keys of
// Config.RateLimits (every name but "other"), by api.RouteID.
var routeNames = api.Labels(routeCount)

// scopeOf is the API key scope a public route needs (api.Route.Scope).
func scopeOf(r api.Route) apikey.Scope { return apikey.Scope(r.Scope) }

// Rate is a token bucket: PerSec requests a second on average, up to Burst at once.
type Rate struct {
	PerSec int // sustained requests per second, >= 1
	Burst  int // requests allowed back to back after a quiet spell, >= 1
}

func (r Rate) valid() bool { return r.PerSec >= 1 && r.Burst >= 1 }

// RouteNames returns the names Config.RateLimits is keyed by, sorted.
func RouteNames() []string {
	out := append(make([]string, 0, routeCount-1), routeNames[routeOther+1:]...)
	sort.Strings(out)
	return out
}

func validateRateLimits(m map[string]Rate) error {
	known := map[string]bool{}
	for _, n := range routeNames[routeOther+1:] {
		known[n] = true
		if r, ok := m[n]; !ok || !r.valid() {
			return fmt.Errorf("router: RateLimits[%q] must have PerSec >= 1 and Burst >= 1, got %+v", n, m[n])
		}
	}
	for n := range m {
		if !known[n] {
			return fmt.Errorf("router: RateLimits has unknown route %q (routes: %v)", n, RouteNames())
		}
	}
	return nil
}

// newRouteLimiters makes one token bucket per route; routeOther has none
// (those requests never reach a cell).
func newRouteLimiters(m map[string]Rate) [routeCount]*rate.Limiter {
	var out [routeCount]*rate.Limiter
	for id := routeOther + 1; id < routeCount; id++ {
		r := m[routeNames[id]]
		out[id] = rate.NewLimiter(rate.Limit(r.PerSec), r.Burst)
	}
	return out
}

// userShards splits the per-user limiters so that concurrent requests of
// different users rarely share a lock.
const userShards = 64

// userLimits is the per-user request frequency limit: one token bucket per
// act_id, in a bounded map. Each shard keeps two generations of limiters; a
// user seen in the old generation moves to the current one, and when the
// current one is full the old one is dropped whole. So a user who keeps
// sending always keeps its bucket (a limited user cannot shake off its limit by
// waiting for eviction while it is still sending), a user idle for a whole
// generation is forgotten, and the map never holds more than max limiters.
// Forgetting a user costs nothing but a fresh burst. Safe for concurrent use.
type userLimits struct {
	rate     rate.Limit
	burst    int
	shardMax int // limiters per generation per shard
	seed     maphash.Seed
	shards   [userShards]userShard
}

type userShard struct {
	mu       sync.Mutex // guards cur and old
	cur, old map[string]*rate.Limiter
}

// newUserLimits keeps at most maxUsers limiters (rounded down to a multiple of
// 2*userShards, at least one per shard and generation).
func newUserLimits(r Rate, maxUsers int) *userLimits {
	u := &userLimits{rate: rate.Limit(r.PerSec), burst: r.Burst, shardMax: max(1, maxUsers/(2*userShards)), seed: maphash.MakeSeed()}
	for i := range u.shards {
		u.shards[i].cur = make(map[string]*rate.Limiter)
		u.shards[i].old = make(map[string]*rate.Limiter)
	}
	return u
}

// allow takes one token of user's bucket at time now and reports whether there was one.
func (u *userLimits) allow(user string, now time.Time) bool {
	sh := &u.shards[maphash.String(u.seed, user)%userShards]
	sh.mu.Lock()
	l, ok := sh.cur[user]
	if !ok {
		if l, ok = sh.old[user]; ok {
			delete(sh.old, user)
		} else {
			l = rate.NewLimiter(u.rate, u.burst)
		}
		if len(sh.cur) >= u.shardMax {
			sh.old, sh.cur = sh.cur, make(map[string]*rate.Limiter, u.shardMax)
		}
		sh.cur[user] = l
	}
	sh.mu.Unlock()
	return l.AllowN(now, 1)
}

// size returns how many users have a limiter now.
func (u *userLimits) size() int {
	n := 0
	for i := range u.shards {
		sh := &u.shards[i]
		sh.mu.Lock()
		n += len(sh.cur) + len(sh.old)
		sh.mu.Unlock()
	}
	return n
}

// ruleRoutes are the route names the rules file names routes by, by RouteID
// ("" for routeOther, which no rule sees).
var ruleRoutes = func() []string {
	out := make([]string, routeCount)
	copy(out, routeNames[:])
	out[routeOther] = ""
	return out
}()

// defaultSharedPrefix starts the cluster-wide limits' memcached keys.
const defaultSharedPrefix = "rc:rl:"

// newShared makes the cluster-wide limits of Config.Shared.
func (r *Router) newShared() error {
	sh := r.cfg.Shared
	if sh == nil {
		return nil
	}
	if sh.Memcache == nil {
		return errors.New("router: Shared needs a memcached client")
	}
	prefix := sh.Prefix
	if prefix == "" {
		prefix = defaultSharedPrefix
	}
	for id := routeOther + 1; id < routeCount; id++ {
		rl := r.cfg.RateLimits[routeNames[id]]
		l, err := climit.New(climit.Config{Name: "route-" + routeNames[id], Prefix: prefix, Rate: rl.PerSec,
			Cells: r.routers, FallbackBurst: rl.Burst}, sh.Memcache, sh.Clock)
		if err != nil {
			return fmt.Errorf("router: %w", err)
		}
		r.sharedRoutes[id] = l
	}
	u, err := climit.NewBuckets(climit.BucketsConfig{Prefix: prefix + "user:", PerSec: r.cfg.UserRate.PerSec, Burst: r.cfg.UserRate.Burst,
		Procs: r.routers, MaxLocal: r.cfg.UserLimitersMax}, sh.Memcache, sh.Clock)
	if err != nil {
		return fmt.Errorf("router: %w", err)
	}
	r.sharedUsers = u
	// N from the start: the first requests must not find 0 (taken as 1).
	if sh.Routers != nil {
		r.routersN.Store(int64(max(sh.Routers(), 1)))
		r.routersAt.Store(time.Now().UnixNano())
	}
	return nil
}

// sharedFallingBack reports whether any cluster-wide limit runs on its local
// fallback now (memcached failed within the last second).
func (r *Router) sharedFallingBack() bool {
	if r.sharedUsers == nil {
		return false
	}
	if r.sharedUsers.FallingBack() {
		return true
	}
	for _, l := range r.sharedRoutes {
		if l != nil && l.FallingBack() {
			return true
		}
	}
	return false
}

// routers is how many routers share the limits (Shared.Routers), at least
// 1, asked at most once a second: the fallbacks call it on every request
// while memcached is down.
func (r *Router) routers() int {
	if r.cfg.Shared == nil || r.cfg.Shared.Routers == nil {
		return 1
	}
	now := time.Now().UnixNano()
	if last := r.routersAt.Load(); now-last >= int64(time.Second) && r.routersAt.CompareAndSwap(last, now) {
		r.routersN.Store(int64(r.cfg.Shared.Routers()))
	}
	return int(max(r.routersN.Load(), 1))
}

// newRuleBucket makes a limit rule's buckets: shared through memcached with
// Config.Shared, else this router's own.
func (r *Router) newRuleBucket(rule string, perSec, burst int) (rules.Bucket, error) {
	cfg := climit.BucketsConfig{PerSec: perSec, Burst: burst, MaxLocal: r.cfg.UserLimitersMax}
	if sh := r.cfg.Shared; sh != nil {
		prefix := sh.Prefix
		if prefix == "" {
			prefix = defaultSharedPrefix
		}
		cfg.Prefix, cfg.Procs = prefix+"rule:"+rule+":", r.routers
		return climit.NewBuckets(cfg, sh.Memcache, sh.Clock)
	}
	return climit.NewBuckets(cfg, nil, nil) // nil, not a typed nil: this router's own buckets
}

// retryAfterSecs is a wait as Retry-After's whole seconds, at least 1.
func retryAfterSecs(d time.Duration) int {
	return max(1, int((d+time.Second-1)/time.Second))
}
