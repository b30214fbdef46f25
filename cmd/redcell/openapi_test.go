package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"redcell/api"
	"redcell/cell/admin"
	"redcell/internal/testenv"
	"redcell/router"
)

// The API contract, docs/openapi.yaml, held to what a running cluster
// answers. Every request a cluster test sends to the router's public port or
// to an admin port (through http.DefaultClient, which TestMain wraps, or a
// client built on specTransport) is checked with its answer against the
// spec by kin-openapi: the answer's status must be one the operation lists,
// its headers and body must fit that response's schemas, an error answer's
// X-Redcell-Code must be its envelope's code, and a request the spec refuses
// must not have been answered 2xx. A mismatch fails the test: at once the
// test that sent the request when it says so (do, withSpecTest), else the
// test that started the cluster, when the cluster's cleanup checks what it
// kept (the drills' loads must not slow down while they run). The cells'
// main ports are no part of the contract and are not checked.

// specPath is the contract, relative to this package.
const specPath = "../../docs/openapi.yaml"

// specPort names the server of the spec a request went to.
type specPort int

const (
	specPublic      specPort = iota + 1 // the router's public port
	specRouterAdmin                     // the router's admin port
	specCellAdmin                       // a cell's admin port
)

// specServer is the host of each port in the spec's servers: a request is
// matched against the spec as if sent there, so that a path is found only
// on the port the spec says serves it.
var specServer = map[specPort]string{specPublic: "127.0.0.1:8080", specRouterAdmin: "127.0.0.1:9200", specCellAdmin: "127.0.0.1:9201"}

func (p specPort) String() string {
	return map[specPort]string{specPublic: "public", specRouterAdmin: "router-admin", specCellAdmin: "cell-admin"}[p]
}

// openAPISpec is the loaded, validated contract and its router.
type openAPISpec struct {
	doc    *openapi3.T
	router routers.Router
}

// loadSpec loads docs/openapi.yaml once per test process and validates it
// as an OpenAPI 3.0 document.
var loadSpec = sync.OnceValues(func() (*openAPISpec, error) {
	doc, err := openapi3.NewLoader().LoadFromFile(specPath)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", specPath, err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("%s is no valid OpenAPI document: %w", specPath, err)
	}
	r, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("%s: router: %w", specPath, err)
	}
	return &openAPISpec{doc: doc, router: r}, nil
})

func mustSpec(t *testing.T) *openAPISpec {
	t.Helper()
	s, err := loadSpec()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// bearerPresent is the spec's security check: both schemes are HTTP bearer
// tokens, whose value only the server can judge; the request must carry one.
func bearerPresent(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	v := in.RequestValidationInput.Request.Header.Get("Authorization")
	if len(v) > len("bearer ") && strings.EqualFold(v[:len("bearer ")], "bearer ") {
		return nil
	}
	return errors.New("no Authorization: Bearer token")
}

// check matches one request (its body apart, as sent) and the answer it got
// against the spec. op is the operation it matched ("GET
// /v1/accounts/{act_id}", or "no operation"); problem is "" when request and
// answer fit the contract, else what does not.
func (s *openAPISpec) check(port specPort, req *http.Request, reqBody []byte, status int, header http.Header, body []byte) (op, problem string) {
	ctx := context.Background()
	vr := req.Clone(ctx)
	vr.URL.Scheme, vr.URL.Host, vr.Host = "http", specServer[port], specServer[port]
	vr.Body, vr.ContentLength = io.NopCloser(bytes.NewReader(reqBody)), int64(len(reqBody))
	vr.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(reqBody)), nil }
	if port == specCellAdmin && len(reqBody) > 0 && vr.Header.Get("Content-Type") == "" {
		vr.Header.Set("Content-Type", "application/json") // the cell admin port reads any body as JSON (the spec's info says so)
	}
	route, params, err := s.router.FindRoute(vr)
	if err != nil {
		return "no operation", s.checkUnrouted(port, err, status, header, body)
	}
	op = route.Method + " " + route.Path
	in := &openapi3filter.RequestValidationInput{Request: vr, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: bearerPresent, SkipSettingDefaults: true}}
	if err := openapi3filter.ValidateRequest(ctx, in); err != nil && status < 300 {
		return op, fmt.Sprintf("the spec refuses this request (%v), yet it was answered %d", err, status)
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: status, Header: header,
		Body: io.NopCloser(bytes.NewReader(body)), Options: &openapi3filter.Options{IncludeResponseStatus: true}}
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		return op, err.Error()
	}
	if status >= 400 {
		return op, envelopeProblem(status, header, body)
	}
	return op, ""
}

// checkUnrouted checks the answer to a request no operation of the spec
// has (err says whether the path is unknown or only the method): it must be
// an error envelope, 404 or 405 on the public port (before any key is
// read), 401, 403 or 404 on an admin port (the token first); 400 and 413 are
// the answers to a request that is no valid HTTP, on any path.
func (s *openAPISpec) checkUnrouted(port specPort, err error, status int, header http.Header, body []byte) string {
	var v any
	if jerr := json.Unmarshal(body, &v); jerr != nil {
		return fmt.Sprintf("no operation of the spec has this request (%v), and its answer is no JSON: %v", err, jerr)
	}
	if verr := s.doc.Components.Schemas["Error"].Value.VisitJSON(v); verr != nil {
		return fmt.Sprintf("no operation of the spec has this request (%v), and its answer is no error envelope: %v", err, verr)
	}
	want := []int{http.StatusBadRequest, http.StatusRequestEntityTooLarge}
	switch {
	case port != specPublic:
		want = append(want, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound)
	case errors.Is(err, routers.ErrMethodNotAllowed):
		want = append(want, http.StatusMethodNotAllowed)
	default:
		want = append(want, http.StatusNotFound)
	}
	if !slices.Contains(want, status) {
		return fmt.Sprintf("no operation of the spec has this request (%v), so the answer must be one of %v, not %d", err, want, status)
	}
	return envelopeProblem(status, header, body)
}

// envelopeProblem checks an error answer beyond its schema: its
// X-Redcell-Code is its envelope's code, the status is the code's in the
// api table (ADMIN_DISABLED: 403), and "retryable" is present exactly for
// the retryable codes.
func envelopeProblem(status int, header http.Header, body []byte) string {
	var e struct {
		Error struct {
			Code      string `json:"code"`
			Retryable *bool  `json:"retryable"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Code == "" {
		return fmt.Sprintf("an error answer without an error envelope (%v)", err)
	}
	code := e.Error.Code
	if h := header.Get(api.HeaderCode); h != code {
		return fmt.Sprintf("%s is %q, the envelope's code %q", api.HeaderCode, h, code)
	}
	want := api.Status(code)
	if code == router.ErrAdminDisabled.Code {
		want = http.StatusForbidden
	}
	if status != want {
		return fmt.Sprintf("code %s answered with %d; its status is %d", code, status, want)
	}
	if got := e.Error.Retryable != nil && *e.Error.Retryable; got != api.Retryable(code) || (e.Error.Retryable != nil && !*e.Error.Retryable) {
		return fmt.Sprintf("code %s with retryable %v; want it present (true) exactly for retryable codes", code, e.Error.Retryable)
	}
	return ""
}

// specHosts knows which loopback addresses are the ports of a running test
// cluster (cluster.writeConfig registers them), and keeps the exchanges
// with them that are checked when the cluster's test ends.
var specHosts = struct {
	mu    sync.Mutex // guards hosts and later; held while a mismatch is reported, so that a test is not failed after its cluster is gone
	hosts map[string]specTarget
	later map[*cluster][]specExchange
}{hosts: map[string]specTarget{}, later: map[*cluster][]specExchange{}}

// specExchange is a request (its body apart) and its answer, kept to be
// checked later.
type specExchange struct {
	port    specPort
	req     *http.Request
	reqBody []byte
	status  int
	header  http.Header
	body    []byte
}

type specTarget struct {
	port  specPort
	owner *cluster
}

// specRegister records the ports of c, as its config has them now.
func specRegister(c *cluster) {
	specHosts.mu.Lock()
	defer specHosts.mu.Unlock()
	add := func(url string, p specPort) {
		specHosts.hosts[strings.TrimPrefix(url, "http://")] = specTarget{port: p, owner: c}
	}
	add(c.router, specPublic)
	add(c.routerAdmin, specRouterAdmin)
	for _, u := range c.adminURL {
		add(u, specCellAdmin)
	}
}

// specForget checks the exchanges with c kept for later, failing c's test
// on a mismatch, and drops c's ports.
func specForget(c *cluster) {
	specHosts.mu.Lock()
	later := specHosts.later[c]
	delete(specHosts.later, c)
	for h, tg := range specHosts.hosts {
		if tg.owner == c {
			delete(specHosts.hosts, h)
		}
	}
	specHosts.mu.Unlock()
	spec, err := loadSpec()
	if err != nil {
		if len(later) > 0 {
			c.t.Error(err)
		}
		return
	}
	for _, x := range later {
		if problem := spec.checkExchange(x); problem != "" {
			c.t.Errorf("%s", problem)
		}
	}
}

// specKeep keeps x to be checked when its cluster's test ends.
func specKeep(host string, x specExchange) {
	specHosts.mu.Lock()
	defer specHosts.mu.Unlock()
	if tg, ok := specHosts.hosts[host]; ok {
		specHosts.later[tg.owner] = append(specHosts.later[tg.owner], x)
	}
}

// checkExchange checks x, counts it, and returns its problem as a test
// failure's text ("" when it fits the contract).
func (s *openAPISpec) checkExchange(x specExchange) string {
	code := x.header.Get(api.HeaderCode)
	op, problem := s.check(x.port, x.req, x.reqBody, x.status, x.header, x.body)
	specCounted(x.port, op, x.status, code)
	if problem == "" {
		return ""
	}
	body := x.body
	if len(body) > 400 {
		body = append(body[:400:400], "..."...)
	}
	return fmt.Sprintf("openapi: %s port: %s %s (%s) answered %d, against %s: %s\n  answer: %s",
		x.port, x.req.Method, x.req.URL.RequestURI(), op, x.status, specPath, problem, body)
}

func specLookup(host string) (specTarget, bool) {
	specHosts.mu.Lock()
	defer specHosts.mu.Unlock()
	tg, ok := specHosts.hosts[host]
	return tg, ok
}

// specTestKey carries, in a request's context, the test that sent it.
type specTestKey struct{}

// withSpecTest returns a context that names t as the sender of a request.
func withSpecTest(t *testing.T) context.Context {
	return context.WithValue(context.Background(), specTestKey{}, t)
}

// specSampleMax bounds the answers checked per port, route, status and
// code: the drills' loads send thousands of the same request, and the first
// ones say what the rest would.
const specSampleMax = 64

// specTally counts what was checked, for TestMain's summary.
var specTally = struct {
	mu      sync.Mutex
	checked int
	skipped int
	samples map[string]int // port, route, status, code -> answers seen
	pairs   map[string]int // "port op -> status code" -> answers checked
}{samples: map[string]int{}, pairs: map[string]int{}}

// specSample reports whether an answer of this kind is still to be checked.
func specSample(port specPort, method, path string, status int, code string) bool {
	parts, _ := api.PathSegments([]byte(path))
	var rt api.Route
	if port == specPublic {
		rt, _, _ = api.MatchPublic(method, parts)
	} else {
		ap := api.PortCellAdmin
		if port == specRouterAdmin {
			ap = api.PortRouterAdmin
		}
		rt, _, _ = api.MatchAdmin(ap, method, parts)
	}
	key := fmt.Sprintf("%s %s %s %d %s", port, method, rt.Label, status, code)
	if rt.ID == api.RouteOther {
		key += " " + path // unknown paths are few and each says something
	}
	specTally.mu.Lock()
	defer specTally.mu.Unlock()
	specTally.samples[key]++
	if specTally.samples[key] > specSampleMax {
		specTally.skipped++
		return false
	}
	return true
}

func specCounted(port specPort, op string, status int, code string) {
	specTally.mu.Lock()
	defer specTally.mu.Unlock()
	specTally.checked++
	specTally.pairs[fmt.Sprintf("%-12s %-45s -> %d %s", port, op, status, code)]++
}

// specSummary is TestMain's line about the checks, "" when none ran.
func specSummary() string {
	specTally.mu.Lock()
	defer specTally.mu.Unlock()
	if specTally.checked == 0 {
		return ""
	}
	ops := map[string]bool{}
	lines := make([]string, 0, len(specTally.pairs))
	for p, n := range specTally.pairs {
		lines = append(lines, fmt.Sprintf("  %s (%d)", p, n))
		if f := strings.Fields(p); len(f) > 3 && f[1] != "no" {
			ops[f[1]+" "+f[2]] = true // the spec's operation (GET /metrics is one, on two ports)
		}
	}
	sort.Strings(lines)
	return fmt.Sprintf("openapi: %d answers checked against %s (%d more over the sampling bound): %d of its operations, %d distinct port/operation/status/code pairs\n%s\n",
		specTally.checked, filepath.Base(specPath), specTally.skipped, len(ops), len(specTally.pairs), strings.Join(lines, "\n"))
}

// specTransport is an http.RoundTripper that checks every exchange with a
// registered cluster port against the spec (see above); other hosts pass
// through untouched.
type specTransport struct{ next http.RoundTripper }

// newSpecClient is an HTTP client whose exchanges with the test clusters are
// checked against the spec.
func newSpecClient() *http.Client {
	return &http.Client{Transport: specTransport{next: http.DefaultTransport}}
}

func (s specTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	tg, ok := specLookup(req.URL.Host)
	if !ok {
		return s.next.RoundTrip(req)
	}
	var reqBody []byte
	switch {
	case req.GetBody != nil:
		if b, err := req.GetBody(); err == nil {
			reqBody, _ = io.ReadAll(b)
			b.Close()
		}
	case req.Body != nil && req.Body != http.NoBody:
		b, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		reqBody = b
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(bytes.NewReader(b))
	}
	resp, err := s.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	if !specSample(tg.port, req.Method, req.URL.EscapedPath(), resp.StatusCode, resp.Header.Get(api.HeaderCode)) {
		return resp, nil
	}
	body, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	if rerr != nil { // the caller sees the cut answer as it would have
		resp.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), errReader{rerr}))
		return resp, nil
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	x := specExchange{port: tg.port, req: req.Clone(context.Background()), reqBody: reqBody, status: resp.StatusCode,
		header: resp.Header.Clone(), body: body}
	t, _ := req.Context().Value(specTestKey{}).(*testing.T)
	if t == nil {
		specKeep(req.URL.Host, x)
		return resp, nil
	}
	spec, err := loadSpec()
	if err != nil {
		t.Error(err)
		return resp, nil
	}
	if problem := spec.checkExchange(x); problem != "" {
		t.Errorf("%s", problem)
	}
	return resp, nil
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// TestOpenAPIMatchesTheCode: the spec has an operation for every route of
// api's table on the port the table says, and no other (but the router's
// /healthz); each public operation names its route's API key scope and
// lists the statuses the router itself answers; the error code enum is
// every code the code has, and its retryable ones are api's; and every error
// response of every operation allows exactly the codes of its status. So neither side can change
// without the other.
func TestOpenAPIMatchesTheCode(t *testing.T) {
	s := mustSpec(t)
	serversOf := func(path string) []string {
		var out []string
		pi := s.doc.Paths.Value(path)
		servers := s.doc.Servers
		if len(pi.Servers) > 0 {
			servers = pi.Servers
		}
		for _, sv := range servers {
			out = append(out, strings.TrimPrefix(sv.URL, "http://"))
		}
		return out
	}
	want := map[string]bool{"GET /healthz": true} // method path -> seen in the table
	for _, r := range api.Routes() {
		if r.Pattern == "" {
			continue
		}
		key := r.Method + " " + r.Pattern
		pi := s.doc.Paths.Value(r.Pattern)
		if r.Internal {
			if pi != nil {
				t.Errorf("%s is an internal route (cell to cell), yet the spec lists its path", key)
			}
			continue
		}
		want[key] = true
		var op *openapi3.Operation
		if pi != nil {
			op = pi.GetOperation(r.Method)
		}
		if op == nil {
			t.Errorf("route %s (%s) has no operation in %s", key, r.Label, specPath)
			continue
		}
		servers := serversOf(r.Pattern)
		var ports []string
		switch {
		case r.Public():
			ports = []string{specServer[specPublic]}
		case r.ID == api.RouteMetrics:
			ports = []string{specServer[specRouterAdmin], specServer[specCellAdmin]} // both admin ports serve it
		case r.Port == api.PortCellAdmin:
			ports = []string{specServer[specCellAdmin]}
		case r.Port == api.PortRouterAdmin:
			ports = []string{specServer[specRouterAdmin]}
		}
		if !slices.Equal(servers, ports) {
			t.Errorf("%s: the spec serves it on %v, the route table on %v", key, servers, ports)
		}
		checkOperationSecurity(t, key, r, op)
	}
	for path, pi := range s.doc.Paths.Map() {
		for method := range pi.Operations() {
			if !want[method+" "+path] {
				t.Errorf("the spec has %s %s, which no route of api's table serves", method, path)
			}
		}
	}

	// The error codes: model's sentinels (read from its source, so that a
	// new one counts even before the api table has it), the api table's, and
	// the admin ports' ADMIN_DISABLED.
	codes := map[string]bool{}
	for _, c := range modelErrorCodes(t) {
		codes[c] = true
	}
	for _, c := range api.Codes() {
		codes[c] = true
	}
	codes[router.ErrAdminDisabled.Code], codes[admin.ErrAdminDisabled.Code] = true, true
	var enum []string
	for _, v := range s.doc.Components.Schemas["ErrorCode"].Value.Enum {
		enum = append(enum, v.(string))
	}
	sort.Strings(enum)
	if all := sortedKeys(codes); !slices.Equal(enum, all) {
		t.Errorf("ErrorCode enum %v; the code has %v", enum, all)
	}
	var retry, wantRetry []string
	list, _ := s.doc.Components.Schemas["ErrorCode"].Value.Extensions["x-redcell-retryable"].([]any)
	for _, v := range list {
		c, _ := v.(string)
		retry = append(retry, c)
	}
	for _, c := range api.Codes() {
		if api.Retryable(c) {
			wantRetry = append(wantRetry, c)
		}
	}
	sort.Strings(retry)
	if !slices.Equal(retry, wantRetry) {
		t.Errorf("ErrorCode x-redcell-retryable %v; the retryable codes are %v", retry, wantRetry)
	}

	// Every error response allows exactly the codes of its status.
	seen := map[string]bool{} // shared responses (components) are reported once
	for path, pi := range s.doc.Paths.Map() {
		for method, op := range pi.Operations() {
			adminOp := strings.HasPrefix(path, "/admin/")
			for status, rr := range op.Responses.Map() {
				n, _ := strconv.Atoi(status)
				if n < 400 {
					continue
				}
				wantCodes := codesOfStatus(n)
				if adminOp && n == http.StatusForbidden {
					wantCodes = []string{"ADMIN_DISABLED"}
				}
				if rr.Ref != "" && seen[rr.Ref] {
					continue
				}
				seen[rr.Ref] = rr.Ref != ""
				header, body := responseCodes(rr.Value)
				if !slices.Equal(header, wantCodes) || (body != nil && !slices.Equal(body, wantCodes)) {
					t.Errorf("%s %s %d: codes %v in X-Redcell-Code, %v in the body; the status has %v", method, path, n, header, body, wantCodes)
				}
			}
		}
	}
}

// checkOperationSecurity: a public operation takes the API key (the
// document's default) and names its route's scope; an admin one the admin
// token, but GET /metrics, which needs none.
func checkOperationSecurity(t *testing.T, key string, r api.Route, op *openapi3.Operation) {
	t.Helper()
	if r.Public() {
		if scope, _ := op.Extensions["x-redcell-scope"].(string); scope != r.Scope {
			t.Errorf("%s: x-redcell-scope %q, the route's scope %q", key, scope, r.Scope)
		}
		if op.Security != nil {
			t.Errorf("%s: a public operation must take the document's security (the API key), not its own", key)
		}
		statuses := []string{"400", "401", "403", "404", "429", "500", "503", "504"}
		if op.RequestBody != nil {
			statuses = append(statuses, "413", "415")
		}
		for _, st := range statuses {
			if op.Responses.Value(st) == nil {
				t.Errorf("%s lists no %s, which the router answers on every public route", key, st)
			}
		}
		return
	}
	wantSec := "adminToken"
	if r.ID == api.RouteMetrics {
		wantSec = ""
	}
	got := ""
	if op.Security != nil && len(*op.Security) == 1 {
		for name := range (*op.Security)[0] {
			got = name
		}
	}
	if op.Security == nil || got != wantSec || (wantSec == "" && len(*op.Security) != 0) {
		t.Errorf("%s: security %v, want %q", key, op.Security, wantSec)
	}
	if wantSec != "" {
		for _, st := range []string{"400", "401", "403"} {
			if op.Responses.Value(st) == nil {
				t.Errorf("%s lists no %s, which the admin ports answer on every admin route", key, st)
			}
		}
	}
}

// codesOfStatus is every code of api's table answered with status, sorted.
func codesOfStatus(status int) []string {
	var out []string
	for _, c := range api.Codes() {
		if api.Status(c) == status {
			out = append(out, c)
		}
	}
	return out
}

// responseCodes returns the codes an error response allows in its
// X-Redcell-Code header and in its body (nil when the body's schema names
// none of its own, as the 422 of tokens does through its header only).
func responseCodes(r *openapi3.Response) (header, body []string) {
	enumOf := func(s *openapi3.Schema) []string {
		var out []string
		for _, v := range s.Enum {
			out = append(out, v.(string))
		}
		sort.Strings(out)
		return out
	}
	if h := r.Headers[api.HeaderCode]; h != nil && h.Value.Schema != nil {
		header = enumOf(h.Value.Schema.Value)
	}
	mt := r.Content.Get("application/json")
	if mt == nil || mt.Schema == nil {
		return header, nil
	}
	for _, part := range mt.Schema.Value.AllOf {
		if e := part.Value.Properties["error"]; e != nil && part.Ref == "" {
			if c := e.Value.Properties["code"]; c != nil {
				body = enumOf(c.Value)
			}
		}
	}
	return header, body
}

// modelErrorCodes reads the codes of package model's sentinel errors from
// its source: every &Error{"CODE", ...}.
func modelErrorCodes(t *testing.T) []string {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob("../../model/*.go")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			cl, ok := n.(*ast.CompositeLit)
			if !ok || len(cl.Elts) == 0 {
				return true
			}
			if id, ok := cl.Type.(*ast.Ident); !ok || id.Name != "Error" {
				return true
			}
			if lit, ok := cl.Elts[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				code, _ := strconv.Unquote(lit.Value)
				out = append(out, code)
			}
			return true
		})
	}
	if len(out) < 30 {
		t.Fatalf("found only %d error codes in package model: %v", len(out), out)
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestOpenAPICheckFails: the check does fail an answer that breaks the
// contract (and passes those that keep it), so that the cluster tests'
// silence means something.
func TestOpenAPICheckFails(t *testing.T) {
	s := mustSpec(t)
	key := map[string]string{"Authorization": "Bearer rck_0123456789ab_x"}
	jsonKey := map[string]string{"Authorization": "Bearer rck_0123456789ab_x", "Content-Type": "application/json"}
	adminTok := map[string]string{"Authorization": "Bearer e2e-admin-token-0123"}
	errHdr := func(code string) map[string]string { return map[string]string{api.HeaderCode: code} }
	busyHdr := func(code string) map[string]string {
		return map[string]string{api.HeaderCode: code, "Retry-After": "1"}
	}
	for _, c := range []struct {
		name       string
		port       specPort
		method     string
		path       string
		reqHdr     map[string]string
		reqBody    string
		status     int
		respHdr    map[string]string
		respBody   string
		wantReason string // "" when the exchange fits the contract
	}{
		{"account", specPublic, "GET", "/v1/accounts/bob", key, "", 200, nil, `{"act_id":"bob","shard":27,"balance":51}`, ""},
		{"balance as a string", specPublic, "GET", "/v1/accounts/bob", key, "", 200, nil, `{"act_id":"bob","shard":27,"balance":"51"}`, "doesn't match schema"},
		{"a field the spec lacks", specPublic, "GET", "/v1/accounts/bob", key, "", 200, nil, `{"act_id":"bob","shard":27,"balance":5,"vip":true}`, "doesn't match schema"},
		{"a required field missing", specPublic, "GET", "/v1/accounts/bob", key, "", 200, nil, `{"act_id":"bob","balance":5}`, "doesn't match schema"},
		{"a status the operation does not list", specPublic, "GET", "/v1/accounts/bob", key, "", 409, errHdr("ORDER_CONFLICT"),
			`{"error":{"code":"ORDER_CONFLICT","message":"x"}}`, "status is not supported"},
		{"a code of another status", specPublic, "GET", "/v1/packets/2026112928984d4126a33f01cd3", key, "", 404, errHdr("SOLD_OUT"),
			`{"error":{"code":"SOLD_OUT","message":"x"}}`, "doesn't match schema"},
		{"no X-Redcell-Code", specPublic, "GET", "/v1/packets/2026112928984d4126a33f01cd3", key, "", 404, nil,
			`{"error":{"code":"NOT_FOUND","message":"x"}}`, "X-Redcell-Code"},
		{"header and envelope disagree", specPublic, "GET", "/v1/packets/2026112928984d4126a33f01cd3", key, "", 503, busyHdr("MOVING"),
			`{"error":{"code":"OVERLOADED","message":"x","retryable":true}}`, "the envelope's code"},
		{"retryable missing", specPublic, "GET", "/v1/packets/2026112928984d4126a33f01cd3", key, "", 503, busyHdr("OVERLOADED"),
			`{"error":{"code":"OVERLOADED","message":"x"}}`, "retryable"},
		{"an error envelope", specPublic, "GET", "/v1/packets/2026112928984d4126a33f01cd3", key, "", 503, busyHdr("OVERLOADED"),
			`{"error":{"code":"OVERLOADED","message":"x","retryable":true}}`, ""},
		{"a 503 without Retry-After", specPublic, "GET", "/v1/packets/2026112928984d4126a33f01cd3", key, "", 503, errHdr("OVERLOADED"),
			`{"error":{"code":"OVERLOADED","message":"x","retryable":true}}`, "Retry-After"},
		{"a request the spec refuses, answered 200", specPublic, "POST", "/v1/accounts/bob/deposit", jsonKey, `{"amount":"10"}`, 200, nil,
			`{"act_id":"bob","order_no":"d","amount":10,"balance":10,"repeat":false}`, "the spec refuses this request"},
		{"no key, answered 200", specPublic, "GET", "/v1/accounts/bob", nil, "", 200, nil, `{"act_id":"bob","shard":27,"balance":51}`,
			"the spec refuses this request"},
		{"no key, answered 401", specPublic, "GET", "/v1/accounts/bob", nil, "", 401,
			map[string]string{api.HeaderCode: "UNAUTHENTICATED", "WWW-Authenticate": `Bearer realm="redcell"`},
			`{"error":{"code":"UNAUTHENTICATED","message":"x"}}`, ""},
		{"an unknown path, answered 404", specPublic, "GET", "/v2/x", key, "", 404, errHdr("NOT_FOUND"), `{"error":{"code":"NOT_FOUND","message":"x"}}`, ""},
		{"an unknown path, answered 200", specPublic, "GET", "/v2/x", key, "", 200, nil, `{"ok":true}`, "no error envelope"},
		{"another method, answered 404", specPublic, "DELETE", "/v1/accounts/bob", key, "", 404, errHdr("NOT_FOUND"),
			`{"error":{"code":"NOT_FOUND","message":"x"}}`, "must be one of"},
		{"a cell admin route on the router's admin port", specRouterAdmin, "GET", "/admin/strategy", adminTok, "", 200, nil,
			`{"strategy":"grouped","batch_max":64,"batch_wait_ms":2,"group_max":64,"group_wait_ms":2}`, "no error envelope"},
		{"strategy", specCellAdmin, "GET", "/admin/strategy", adminTok, "", 200, nil,
			`{"strategy":"grouped","batch_max":64,"batch_wait_ms":2,"group_max":64,"group_wait_ms":2}`, ""},
		{"an unknown strategy", specCellAdmin, "GET", "/admin/strategy", adminTok, "", 200, nil,
			`{"strategy":"fastest","batch_max":64,"batch_wait_ms":2,"group_max":64,"group_wait_ms":2}`, "doesn't match schema"},
		{"ADMIN_DISABLED", specCellAdmin, "GET", "/admin/strategy", adminTok, "", 403, errHdr("ADMIN_DISABLED"),
			`{"error":{"code":"ADMIN_DISABLED","message":"x"}}`, ""},
	} {
		req, _ := http.NewRequest(c.method, "http://127.0.0.1:1"+c.path, nil)
		for k, v := range c.reqHdr {
			req.Header.Set(k, v)
		}
		h := http.Header{"Content-Type": []string{"application/json"}}
		for k, v := range c.respHdr {
			h.Set(k, v)
		}
		_, problem := s.check(c.port, req, []byte(c.reqBody), c.status, h, []byte(c.respBody))
		switch {
		case c.wantReason == "" && problem != "":
			t.Errorf("%s: the check refused an exchange that fits the contract: %s", c.name, problem)
		case c.wantReason != "" && !strings.Contains(problem, c.wantReason):
			t.Errorf("%s: the check said %q, want a problem with %q", c.name, problem, c.wantReason)
		}
	}
}

// openAPITour sends, on the cluster of TestEndToEnd, what the other cluster
// tests do not: the routes and answers only the spec's checks care about
// (the identity binding, the reward and coupon routes on a cluster without
// them, refusals of the router and both admin ports, a user's rate limit).
// Each exchange is checked against the spec on the way (specTransport); the
// tour checks only the statuses. sender is an act_id of cell-1 with money,
// expired a packet past its expiry.
func openAPITour(t *testing.T, c *cluster, sender, expired string) {
	t.Helper()
	start := time.Now()
	defer func() { t.Logf("openAPITour: %s", time.Since(start).Round(time.Millisecond)) }()
	r := c.router
	type call struct {
		method, url, body string
		hdr               map[string]string
		want              int
	}
	key := map[string]string{"Authorization": "Bearer " + testAPIKey, "Content-Type": "application/json"}
	adminTok := map[string]string{"Authorization": "Bearer e2e-admin-token-0123", "Content-Type": "application/json"}
	cellAdmin, routerAdmin := c.adminURL["cell-1"], c.routerAdmin
	acct := r + "/v1/accounts/" + sender
	const phone = `{"phone":"+8613800138000"}`
	calls := []call{
		{"POST", r + "/v1/noop/" + sender, "", key, 200},
		{"PUT", r + "/v1/identities/chat/" + sender, phone, key, 200},
		{"PUT", r + "/v1/identities/chat/" + sender, phone, key, 200},
		{"PUT", r + "/v1/identities/chat/" + sender, `{"phone":"+8613900139000"}`, key, 409},
		{"PUT", r + "/v1/identities/chat/" + sender + "-nophone", "", key, 200},
		{"PUT", r + "/v1/identities/chat/" + sender + "-bad", `{"phone":"12"}`, key, 400},
		{"GET", acct + "/wallet", "", key, 200},
		{"GET", acct + "/wallet?stage=final", "", key, 400},
		{"GET", acct + "/flow?limit=5", "", key, 200},
		{"GET", acct + "/rewards", "", key, 200},
		{"POST", acct + "/book", "", key, 200},
		{"POST", acct + "/withdraw", `{"amount":10000000000,"order_no":"wd-spec"}`, key, 409}, // above the balance: nothing written
		{"PUT", cellAdmin + "/admin/withdraw", `{"percent":0,"allow":[]}`, adminTok, 200},
		{"POST", acct + "/withdraw", `{"amount":1,"order_no":"wd-spec"}`, key, 403}, // not released
		{"PUT", cellAdmin + "/admin/withdraw", `{"percent":100}`, adminTok, 200},
		{"PUT", cellAdmin + "/admin/degrade", `{"wallet_flow":"off","claims_list":"off"}`, adminTok, 200},
		{"GET", acct + "/flow", "", key, 503},
		{"GET", acct + "/wallet", "", key, 200},
		{"GET", r + "/v1/packets/" + expired, "", key, 200},
		{"PUT", cellAdmin + "/admin/degrade", `{"wallet_flow":"on","claims_list":"on"}`, adminTok, 200},
		{"POST", r + "/v1/packets/" + expired + "/open", `{"act_id":"` + sender + `-late"}`, key, 410},
		{"POST", acct + "/tokens", `{"tokens":["v1.x"]}`, key, 404},
		{"POST", r + "/v1/rewards", `{"parent_activity_id":"demo-festival","scene_id":"rain","rain_id":"r1","act_id":"` + sender +
			`","award_type":"cash","amount":1}`, key, 404},
		{"GET", r + "/v1/activities/demo-festival/issued", "", key, 404},
		{"POST", r + "/v1/coupons/issue", `{"act_id":"` + sender + `","batch_id":"b","serial_no":"s1"}`, key, 501},
		{"GET", r + "/v1/coupons/issue/s1?act_id=" + sender, "", key, 501},
		{"GET", acct + "/coupons", "", key, 501},
		{"GET", acct, "", nil, 401},
		{"POST", acct + "/deposit", `{"amount":1,"order_no":"d"`, key, 400},
		{"POST", acct + "/deposit", `{"amount":1,"order_no":"d","note":"x"}`, key, 400},
		{"POST", acct + "/deposit", `{"amount":1,"order_no":"d","pad":"` + strings.Repeat("x", 70_000) + `"}`, key, 413},
		{"GET", r + "/v1/packets/20261129000ffffffffffffffff?limit=0", "", key, 400},
		{"POST", r + "/v1/packets/20261129000ffffffffffffffff/grab", `{"act_id":"` + sender + `"}`, key, 404},
		{"PUT", r + "/v1/packets", "", key, 405},

		{"GET", routerAdmin + "/admin/keys", "", adminTok, 200},
		{"GET", routerAdmin + "/admin/keys", "", nil, 401},
		{"POST", routerAdmin + "/admin/keys", `{"app":"spec","scopes":["read","read"]}`, adminTok, 400},
		{"POST", routerAdmin + "/admin/keys", `{"app":"spec","scopes":["read"]}`, map[string]string{"Authorization": adminTok["Authorization"]}, 415},
		{"DELETE", routerAdmin + "/admin/keys/000000000000", "", adminTok, 404},
		{"GET", routerAdmin + "/admin/cells", "", adminTok, 200},
		{"POST", routerAdmin + "/admin/cells", `{"op":"split"}`, adminTok, 400},
		{"GET", routerAdmin + "/admin/nothing", "", adminTok, 404},
		{"GET", routerAdmin + "/admin/rules", "", adminTok, 0}, // 404 without a rules file
		{"POST", routerAdmin + "/admin/rules/reload", "", adminTok, 0},

		{"GET", cellAdmin + "/admin/degrade", "", adminTok, 200},
		{"PUT", cellAdmin + "/admin/degrade", `{"relay":"maybe"}`, adminTok, 400},
		{"PUT", cellAdmin + "/admin/degrade", `{"claims_list":"on"}`, adminTok, 200},
		{"GET", cellAdmin + "/admin/withdraw", "", adminTok, 200},
		{"PUT", cellAdmin + "/admin/withdraw", `{"percent":101}`, adminTok, 400},
		{"GET", cellAdmin + "/admin/activities", "", adminTok, 200},
		{"POST", cellAdmin + "/admin/activities/reload", "", adminTok, 404},
		{"GET", cellAdmin + "/admin/coupons", "", adminTok, 404},
		{"PUT", cellAdmin + "/admin/coupons", `{"merge_max":16}`, adminTok, 404},
		{"POST", cellAdmin + "/admin/coupons/reload", "", adminTok, 404},
		{"GET", cellAdmin + "/admin/strategy", "", adminTok, 200},
		{"GET", cellAdmin + "/admin/moves", "", adminTok, 200},
		{"POST", cellAdmin + "/admin/moves", `{"op":"split","db":0}`, adminTok, 400},
		{"POST", cellAdmin + "/admin/moves", `{"op":"thaw","db":99}`, adminTok, 421},
		{"POST", cellAdmin + "/admin/audit?space=both", "", adminTok, 400},
		{"POST", cellAdmin + "/admin/audit?space=real", "", adminTok, 200},
		{"GET", cellAdmin + "/admin/strategy", "", map[string]string{"Authorization": "Bearer " + testAPIKey}, 401},
		{"DELETE", cellAdmin + "/admin/strategy", "", adminTok, 404},
		{"GET", cellAdmin + "/metrics", "", nil, 200},
	}
	send := func(cl call) (int, http.Header, []byte) {
		t.Helper()
		var rd io.Reader
		if cl.body != "" {
			rd = strings.NewReader(cl.body)
		}
		req, _ := http.NewRequestWithContext(withSpecTest(t), cl.method, cl.url, rd)
		for k, v := range cl.hdr {
			if k != "Content-Type" || cl.body != "" {
				req.Header.Set(k, v)
			}
		}
		resp, b := testenv.Do(t, nil, req)
		return resp.StatusCode, resp.Header, b
	}
	for _, cl := range calls {
		if st, _, b := send(cl); st != cl.want && cl.want != 0 {
			t.Errorf("%s %s: %d %s, want %d", cl.method, cl.url, st, b, cl.want)
		}
	}

	// A key made, listed and revoked on the router's admin port.
	var k router.KeyResponse
	st, _, b := send(call{"POST", routerAdmin + "/admin/keys", `{"app":"spec","scopes":["read"]}`, adminTok, 200})
	if err := json.Unmarshal(b, &k); st != 200 || err != nil {
		t.Fatalf("add a key: %d %s", st, b)
	}
	if st, _, b := send(call{"DELETE", routerAdmin + "/admin/keys/" + k.ID, "", adminTok, 200}); st != 200 {
		t.Errorf("revoke %s: %d %s", k.ID, st, b)
	}

	// One person's burst: the router's per-user limit (20/s, a burst of
	// 40) answers 429 USER_RATE_LIMITED with Retry-After.
	limited := false
	for i := 0; i < 80 && !limited; i++ {
		st, h, _ := send(call{"POST", r + "/v1/noop/" + sender + "-burst", "", key, 0})
		limited = st == http.StatusTooManyRequests && h.Get(api.HeaderCode) == "USER_RATE_LIMITED" && h.Get("Retry-After") == "1"
	}
	if !limited {
		t.Errorf("80 no-ops of one act_id at once were never answered 429 USER_RATE_LIMITED")
	}
}

// CloseIdleConnections passes http.Client.CloseIdleConnections on.
func (s specTransport) CloseIdleConnections() {
	if c, ok := s.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}
