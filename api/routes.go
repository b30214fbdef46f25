package api

import (
	"net/http"
	"strings"

	"redcell/model"
)

// RouteID names a route of the table; it indexes the rate limiters and the
// metric series of the router and the cells. RouteOther (0) is no route: an
// unknown path or one the server does not serve.
type RouteID uint8

// The routes. The public ones come first, in the order of their metric
// labels; the internal ones (cell to cell) next; the admin ones last.
const (
	RouteOther RouteID = iota
	RouteAccount
	RouteDeposit
	RouteSend
	RouteDetail
	RouteGrab
	RouteOpen
	RouteNoop
	RouteIdentity
	RouteReward       // POST /v1/rewards: issue a reward
	RouteRewards      // GET /v1/accounts/{act_id}/rewards: a person's rewards
	RouteWallet       // GET /v1/accounts/{act_id}/wallet: balance, pending, cumulative income by stage
	RouteFlow         // GET /v1/accounts/{act_id}/flow: the wallet's flow, newest first
	RouteWithdraw     // POST /v1/accounts/{act_id}/withdraw
	RouteTokens       // POST /v1/accounts/{act_id}/tokens: the client's copies of reward tokens
	RouteIssued       // GET /v1/activities/{parent_activity_id}/issued: issued so far, from in-process counters
	RouteBook         // POST /v1/accounts/{act_id}/book: forced booking of a person's pending rewards
	RouteCouponIssue  // POST /v1/coupons/issue: take a coupon (accepted, issued behind)
	RouteCouponState  // GET /v1/coupons/issue/{serial_no}?act_id=: a coupon request's state
	RouteCoupons      // GET /v1/accounts/{act_id}/coupons: the coupons a person holds
	RouteCredits      // POST /internal/credits, cell to cell
	RouteRecon        // POST /internal/recon, cell to cell
	RouteBudgetLease  // POST /internal/budget/lease, cell to the scene's home cell
	RouteBudgetReturn // POST /internal/budget/return, cell to the scene's home cell
	RouteBudgetLeases // POST /internal/budget/leases, a restarted cell to a scene's home: its leases to settle
	RouteCouponStock  // POST /internal/coupons/stock, a cell to coupon batches' home: their stock now, for its local copy

	RouteMetrics          // GET /metrics on an admin port, no token
	RouteStrategyGet      // GET /admin/strategy on a cell's admin port
	RouteStrategyPut      // PUT /admin/strategy on a cell's admin port
	RouteDegradeGet       // GET /admin/degrade on a cell's admin port
	RouteDegradePut       // PUT /admin/degrade on a cell's admin port
	RouteAudit            // POST /admin/audit on a cell's admin port
	RouteShards           // GET /admin/shards on a cell's admin port
	RouteActivities       // GET /admin/activities on a cell's admin port
	RouteActivitiesReload // POST /admin/activities/reload on a cell's admin port
	RouteWithdrawGet      // GET /admin/withdraw on a cell's admin port: the withdrawal release
	RouteWithdrawPut      // PUT /admin/withdraw on a cell's admin port
	RouteCouponBatches    // GET /admin/coupons on a cell's admin port: the coupon batches and their stock
	RouteCouponsReload    // POST /admin/coupons/reload on a cell's admin port
	RouteCouponsPut       // PUT /admin/coupons on a cell's admin port: the merge bound
	RouteShadowCleanup    // POST /admin/shadow/cleanup on a cell's admin port: drop the shadow databases
	RouteMovesGet         // GET /admin/moves on a cell's admin port: ownership, frozen and moved-out databases
	RouteMovesPost        // POST /admin/moves on a cell's admin port: one step of a database move
	RouteFailoverPost     // POST /admin/failover on a cell's admin port: switch back to the rebuilt primary
	RouteCellsGet         // GET /admin/cells on the router's admin port: the last change of the cells
	RouteCellsPost        // POST /admin/cells on the router's admin port: add or remove a cell, move a database
	RouteKeysList         // GET /admin/keys on the router's admin port
	RouteKeysAdd          // POST /admin/keys on the router's admin port
	RouteKeysRevoke       // DELETE /admin/keys/{id} on the router's admin port
	RouteRulesGet         // GET /admin/rules on the router's admin port: degrade fractions and anti-abuse rules, with hits
	RouteRulesReload      // POST /admin/rules/reload on the router's admin port: read the rules file again
	RouteCount            // the number of RouteIDs, RouteOther included
	routePublicEnd        = RouteCredits
	routeFirstPublic      = RouteAccount
)

// KeyKind says where a route's routing key is: the value hashed to a shard.
type KeyKind uint8

const (
	KeyNone         KeyKind = iota // no key: internal and admin routes, served where they arrive
	KeyActPath                     // the act_id in the path ({act_id})
	KeySenderBody                  // the "sender" field of the JSON body (send)
	KeyPacketPath                  // the packet ID in the path ({packet_id}); its shard is in the ID
	KeyIdentityPath                // the app account of the path ({app}/{app_user_id}), hashed like an act_id
	KeyActBody                     // the "act_id" field of the JSON body (reward issue)
	KeyActivityPath                // the parent activity ID of the path, hashed like an act_id (any cell answers)
	// KeyActQuery: the act_id of the query string (?act_id=), which the
	// caller passes to Locate as pathKey (a coupon request's state).
	KeyActQuery
)

// Port is the listener a route is served on.
type Port uint8

const (
	PortMain        Port = iota // the router's public port and a cell's main port (public and internal routes)
	PortCellAdmin               // a cell's admin port (Authorization: Bearer <admin token>)
	PortRouterAdmin             // the router's admin port (Authorization: Bearer <admin token>)
)

// Route is one entry of the route table.
type Route struct {
	ID      RouteID
	Method  string // http.MethodGet, ...
	Pattern string // e.g. "/v1/packets/{packet_id}/open"; {name} segments are parameters
	Key     KeyKind
	// UserInBody: the act_id the router's per-user limit counts is the body's
	// "act_id" (grab, open). Routes with KeyActPath count the path's act_id,
	// send counts its sender; the others count no user.
	UserInBody bool
	Label      string // metric label value; for public routes also the key of router.Config.RateLimits
	// Internal routes are served by cells only, to other cells: signed with the
	// cluster secret, never forwarded by the router (404 there).
	Internal bool
	// Scope is the API key scope a public route needs at the router
	// (router/apikey.Scope: read, deposit, send, open, identity); "" for the
	// others.
	Scope string
	Port  Port
	segs  []string // Pattern split at '/'; "" marks the parameter
}

// Public reports whether r is a route of the public API (the router forwards it).
func (r Route) Public() bool { return r.ID >= routeFirstPublic && r.ID < routePublicEnd }

// Params are the parameters a path carried, as sent (decoded, not validated).
type Params struct {
	// Key is the {act_id}, {packet_id} or {id} segment; "" for a route
	// without one. A route with two ({app}/{app_user_id}) has them joined by
	// '/', which neither may hold (SplitIdentityKey).
	Key string
}

// routes is the table, indexed by RouteID.
var routes = [RouteCount]Route{
	RouteOther:   {ID: RouteOther, Label: "other"},
	RouteAccount: {ID: RouteAccount, Method: http.MethodGet, Pattern: "/v1/accounts/{act_id}", Key: KeyActPath, Label: "account", Scope: "read"},
	RouteDeposit: {ID: RouteDeposit, Method: http.MethodPost, Pattern: "/v1/accounts/{act_id}/deposit", Key: KeyActPath, Label: "deposit", Scope: "deposit"},
	RouteSend:    {ID: RouteSend, Method: http.MethodPost, Pattern: "/v1/packets", Key: KeySenderBody, Label: "send", Scope: "send"},
	RouteDetail:  {ID: RouteDetail, Method: http.MethodGet, Pattern: "/v1/packets/{packet_id}", Key: KeyPacketPath, Label: "detail", Scope: "read"},
	RouteGrab:    {ID: RouteGrab, Method: http.MethodPost, Pattern: "/v1/packets/{packet_id}/grab", Key: KeyPacketPath, UserInBody: true, Label: "grab", Scope: "open"},
	RouteOpen:    {ID: RouteOpen, Method: http.MethodPost, Pattern: "/v1/packets/{packet_id}/open", Key: KeyPacketPath, UserInBody: true, Label: "open", Scope: "open"},
	RouteNoop:    {ID: RouteNoop, Method: http.MethodPost, Pattern: "/v1/noop/{act_id}", Key: KeyActPath, Label: "noop", Scope: "read"},
	RouteIdentity: {ID: RouteIdentity, Method: http.MethodPut, Pattern: "/v1/identities/{app}/{app_user_id}", Key: KeyIdentityPath,
		Label: "identity", Scope: "identity"},
	RouteReward:   {ID: RouteReward, Method: http.MethodPost, Pattern: RewardsPath, Key: KeyActBody, UserInBody: true, Label: "reward", Scope: "reward"},
	RouteRewards:  {ID: RouteRewards, Method: http.MethodGet, Pattern: "/v1/accounts/{act_id}/rewards", Key: KeyActPath, Label: "rewards", Scope: "read"},
	RouteWallet:   {ID: RouteWallet, Method: http.MethodGet, Pattern: "/v1/accounts/{act_id}/wallet", Key: KeyActPath, Label: "wallet", Scope: "read"},
	RouteFlow:     {ID: RouteFlow, Method: http.MethodGet, Pattern: "/v1/accounts/{act_id}/flow", Key: KeyActPath, Label: "flow", Scope: "read"},
	RouteWithdraw: {ID: RouteWithdraw, Method: http.MethodPost, Pattern: "/v1/accounts/{act_id}/withdraw", Key: KeyActPath, Label: "withdraw", Scope: "withdraw"},
	RouteTokens:   {ID: RouteTokens, Method: http.MethodPost, Pattern: "/v1/accounts/{act_id}/tokens", Key: KeyActPath, Label: "tokens", Scope: "reward"},
	RouteIssued: {ID: RouteIssued, Method: http.MethodGet, Pattern: "/v1/activities/{parent_activity_id}/issued", Key: KeyActivityPath,
		Label: "issued", Scope: "read"},
	RouteBook: {ID: RouteBook, Method: http.MethodPost, Pattern: "/v1/accounts/{act_id}/book", Key: KeyActPath, Label: "book", Scope: "reward"},
	RouteCouponIssue: {ID: RouteCouponIssue, Method: http.MethodPost, Pattern: CouponIssuePath, Key: KeyActBody, UserInBody: true,
		Label: "coupon_issue", Scope: "coupon"},
	RouteCouponState: {ID: RouteCouponState, Method: http.MethodGet, Pattern: "/v1/coupons/issue/{serial_no}", Key: KeyActQuery,
		Label: "coupon_state", Scope: "read"},
	RouteCoupons:      {ID: RouteCoupons, Method: http.MethodGet, Pattern: "/v1/accounts/{act_id}/coupons", Key: KeyActPath, Label: "coupons", Scope: "read"},
	RouteCredits:      {ID: RouteCredits, Method: http.MethodPost, Pattern: CreditsPath, Label: "credits", Internal: true},
	RouteRecon:        {ID: RouteRecon, Method: http.MethodPost, Pattern: ReconPath, Label: "recon", Internal: true},
	RouteBudgetLease:  {ID: RouteBudgetLease, Method: http.MethodPost, Pattern: BudgetLeasePath, Label: "budget_lease", Internal: true},
	RouteBudgetReturn: {ID: RouteBudgetReturn, Method: http.MethodPost, Pattern: BudgetReturnPath, Label: "budget_return", Internal: true},
	RouteBudgetLeases: {ID: RouteBudgetLeases, Method: http.MethodPost, Pattern: BudgetLeasesPath, Label: "budget_leases", Internal: true},
	RouteCouponStock:  {ID: RouteCouponStock, Method: http.MethodPost, Pattern: CouponStockPath, Label: "coupon_stock", Internal: true},

	RouteMetrics:     {ID: RouteMetrics, Method: http.MethodGet, Pattern: "/metrics", Label: "metrics", Port: PortCellAdmin},
	RouteStrategyGet: {ID: RouteStrategyGet, Method: http.MethodGet, Pattern: "/admin/strategy", Label: "strategy", Port: PortCellAdmin},
	RouteStrategyPut: {ID: RouteStrategyPut, Method: http.MethodPut, Pattern: "/admin/strategy", Label: "strategy", Port: PortCellAdmin},
	RouteDegradeGet:  {ID: RouteDegradeGet, Method: http.MethodGet, Pattern: "/admin/degrade", Label: "degrade", Port: PortCellAdmin},
	RouteDegradePut:  {ID: RouteDegradePut, Method: http.MethodPut, Pattern: "/admin/degrade", Label: "degrade", Port: PortCellAdmin},
	RouteAudit:       {ID: RouteAudit, Method: http.MethodPost, Pattern: "/admin/audit", Label: "audit", Port: PortCellAdmin},
	RouteShards:      {ID: RouteShards, Method: http.MethodGet, Pattern: "/admin/shards", Label: "shards", Port: PortCellAdmin},
	RouteActivities:  {ID: RouteActivities, Method: http.MethodGet, Pattern: "/admin/activities", Label: "activities", Port: PortCellAdmin},
	RouteActivitiesReload: {ID: RouteActivitiesReload, Method: http.MethodPost, Pattern: "/admin/activities/reload", Label: "activities",
		Port: PortCellAdmin},
	RouteWithdrawGet:   {ID: RouteWithdrawGet, Method: http.MethodGet, Pattern: "/admin/withdraw", Label: "withdraw_release", Port: PortCellAdmin},
	RouteWithdrawPut:   {ID: RouteWithdrawPut, Method: http.MethodPut, Pattern: "/admin/withdraw", Label: "withdraw_release", Port: PortCellAdmin},
	RouteCouponBatches: {ID: RouteCouponBatches, Method: http.MethodGet, Pattern: "/admin/coupons", Label: "coupons", Port: PortCellAdmin},
	RouteCouponsReload: {ID: RouteCouponsReload, Method: http.MethodPost, Pattern: "/admin/coupons/reload", Label: "coupons", Port: PortCellAdmin},
	RouteCouponsPut:    {ID: RouteCouponsPut, Method: http.MethodPut, Pattern: "/admin/coupons", Label: "coupons", Port: PortCellAdmin},
	RouteShadowCleanup: {ID: RouteShadowCleanup, Method: http.MethodPost, Pattern: "/admin/shadow/cleanup", Label: "shadow_cleanup", Port: PortCellAdmin},
	RouteMovesGet:      {ID: RouteMovesGet, Method: http.MethodGet, Pattern: "/admin/moves", Label: "moves", Port: PortCellAdmin},
	RouteMovesPost:     {ID: RouteMovesPost, Method: http.MethodPost, Pattern: "/admin/moves", Label: "moves", Port: PortCellAdmin},
	RouteFailoverPost:  {ID: RouteFailoverPost, Method: http.MethodPost, Pattern: "/admin/failover", Label: "failover", Port: PortCellAdmin},
	RouteCellsGet:      {ID: RouteCellsGet, Method: http.MethodGet, Pattern: "/admin/cells", Label: "cells", Port: PortRouterAdmin},
	RouteCellsPost:     {ID: RouteCellsPost, Method: http.MethodPost, Pattern: "/admin/cells", Label: "cells", Port: PortRouterAdmin},
	RouteKeysList:      {ID: RouteKeysList, Method: http.MethodGet, Pattern: "/admin/keys", Label: "keys", Port: PortRouterAdmin},
	RouteKeysAdd:       {ID: RouteKeysAdd, Method: http.MethodPost, Pattern: "/admin/keys", Label: "keys", Port: PortRouterAdmin},
	RouteKeysRevoke:    {ID: RouteKeysRevoke, Method: http.MethodDelete, Pattern: "/admin/keys/{id}", Label: "keys", Port: PortRouterAdmin},
	RouteRulesGet:      {ID: RouteRulesGet, Method: http.MethodGet, Pattern: "/admin/rules", Label: "rules", Port: PortRouterAdmin},
	RouteRulesReload:   {ID: RouteRulesReload, Method: http.MethodPost, Pattern: "/admin/rules/reload", Label: "rules", Port: PortRouterAdmin},
}

// Paths of the routes without a parameter, and builders for the others. A
// builder takes a key that is already valid (model.ValidateActID,
// model.ParsePacketID) and does not escape it.
//
// HealthPath (GET) is no entry of the table: the router and every cell answer
// it before matching, without an API key or a signature. LivePath (GET) is a
// cell's liveness: 200 {"cell": name} at once, reading nothing (the
// router's health probes: a cell whose database is slow or down is alive).
const (
	HealthPath       = "/healthz"
	LivePath         = "/livez"
	SendPath         = "/v1/packets"
	CreditsPath      = "/internal/credits"
	ReconPath        = "/internal/recon"
	RewardsPath      = "/v1/rewards"
	BudgetLeasePath  = "/internal/budget/lease"
	BudgetReturnPath = "/internal/budget/return"
	BudgetLeasesPath = "/internal/budget/leases"
	CouponIssuePath  = "/v1/coupons/issue"
	CouponStockPath  = "/internal/coupons/stock"
)

// CouponStatePath is GET /v1/coupons/issue/{serial_no}?act_id={act_id}; it
// takes a serial and an act_id that are valid and does not escape them.
func CouponStatePath(serial, actID string) string {
	return CouponIssuePath + "/" + serial + "?act_id=" + actID
}

// AccountPath is GET /v1/accounts/{act_id}.
func AccountPath(actID string) string { return "/v1/accounts/" + actID }

// DepositPath is POST /v1/accounts/{act_id}/deposit.
func DepositPath(actID string) string { return "/v1/accounts/" + actID + "/deposit" }

// PacketPath is GET /v1/packets/{packet_id}.
func PacketPath(id string) string { return "/v1/packets/" + id }

// GrabPath is POST /v1/packets/{packet_id}/grab.
func GrabPath(id string) string { return "/v1/packets/" + id + "/grab" }

// OpenPath is POST /v1/packets/{packet_id}/open.
func OpenPath(id string) string { return "/v1/packets/" + id + "/open" }

// IdentityPath is PUT /v1/identities/{app}/{app_user_id}.
func IdentityPath(app, appUserID string) string { return "/v1/identities/" + app + "/" + appUserID }

// AccountSubPath is /v1/accounts/{act_id}/{sub}: sub is rewards, wallet,
// flow, withdraw or tokens.
func AccountSubPath(actID, sub string) string { return "/v1/accounts/" + actID + "/" + sub }

// IssuedPath is GET /v1/activities/{parent_activity_id}/issued.
func IssuedPath(parent string) string { return "/v1/activities/" + parent + "/issued" }

// NoopPathOf is POST /v1/noop/{act_id} (NoopPath + act_id).
func NoopPathOf(actID string) string { return NoopPath + actID }

func init() {
	for i := range routes {
		r := &routes[i]
		if RouteID(i) != r.ID {
			panic("api: route table out of order")
		}
		if r.Pattern == "" {
			continue
		}
		r.segs = strings.Split(strings.Trim(r.Pattern, "/"), "/")
		for j, s := range r.segs {
			if strings.HasPrefix(s, "{") {
				r.segs[j] = ""
			}
		}
	}
	// The other admin port's /metrics: one pattern served on two ports.
	routerMetrics = routes[RouteMetrics]
	routerMetrics.Port = PortRouterAdmin
}

// routerMetrics is GET /metrics on the router's admin port.
var routerMetrics Route

// Routes returns the table, indexed by RouteID (RouteOther first).
func Routes() []Route { return routes[:] }

// RouteOf returns the entry of id.
func RouteOf(id RouteID) Route { return routes[id] }

// Labels returns the metric label of every RouteID from RouteOther up to, not
// including, end: a label array for a server that serves the routes below end
// (RouteCredits for the router, RouteMetrics for a cell's main port).
func Labels(end RouteID) []string {
	out := make([]string, 0, end)
	for id := RouteOther; id < end; id++ {
		out = append(out, routes[id].Label)
	}
	return out
}

// Match finds the route of a request on the main port (public and internal
// routes) from its method and path segments (PathSegments). Errors:
// model.ErrNotFound ("no route for /<path>") when no route has the path,
// model.ErrMethodNotAllowed when one has it with another method; the route is
// returned with the latter, so that it can label the answer. The router uses
// MatchPublic instead, which does not know the internal routes.
func Match(method string, parts []string) (Route, Params, error) {
	return match(PortMain, true, method, parts)
}

// MatchPublic is Match without the internal routes: a path of an internal
// route is ErrNotFound, as any unknown path.
func MatchPublic(method string, parts []string) (Route, Params, error) {
	return match(PortMain, false, method, parts)
}

// MatchAdmin is Match for an admin port (PortCellAdmin or PortRouterAdmin).
func MatchAdmin(port Port, method string, parts []string) (Route, Params, error) {
	if port == PortRouterAdmin && len(parts) == 1 && parts[0] == "metrics" {
		if method != http.MethodGet {
			return routerMetrics, Params{}, model.ErrMethodNotAllowed
		}
		return routerMetrics, Params{}, nil
	}
	return match(port, false, method, parts)
}

// NoRoute is the error of a path no route has: 404 "no route for /<path>".
func NoRoute(parts []string) error {
	return model.Errorf(model.ErrNotFound, "no route for /%s", strings.Join(parts, "/"))
}

func match(port Port, internal bool, method string, parts []string) (Route, Params, error) {
	var found *Route
	var p Params
	for i := range routes {
		r := &routes[i]
		if r.Port != port || r.segs == nil || (r.Internal && !internal) || !segsMatch(r.segs, parts, &p) {
			continue
		}
		if r.Method == method {
			return *r, p, nil
		}
		if found == nil {
			found = r
		}
	}
	if found != nil {
		return *found, p, model.ErrMethodNotAllowed
	}
	return routes[RouteOther], Params{}, NoRoute(parts)
}

// segsMatch reports whether parts fit the pattern segs, setting p.Key to the
// parameter segment.
func segsMatch(segs, parts []string, p *Params) bool {
	if len(segs) != len(parts) {
		return false
	}
	key, params := "", 0
	for i, s := range segs {
		switch {
		case s == "" && params == 0:
			key, params = parts[i], 1
		case s == "":
			key, params = key+"/"+parts[i], params+1 // only a route of two parameters gets here
		case s != parts[i]:
			return false
		}
	}
	p.Key = key
	return true
}
