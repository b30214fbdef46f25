package router

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/internal/testenv"
	"redcell/router/apikey"
	"redcell/sharding"
)

// signNetHTTP signs req (body as given) with the cluster secret, as the bench
// signs the stress traffic it sends the router.
func signNetHTTP(t *testing.T, req *http.Request, body string) {
	t.Helper()
	ts := time.Now().UnixMilli()
	req.Header.Set(api.HeaderTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(api.HeaderSignature, api.Sign([]byte(testSecret), req.Method, req.URL.RequestURI(), api.Covered{Stress: req.Header.Get(api.HeaderStress) == "1", App: req.Header.Get(api.HeaderApp)}, ts, []byte(body)))
}

// call sends one request with the given headers and returns the status, the
// error code and message of the answer ("" on success).
func call(t *testing.T, method, url, body string, hdr map[string]string) (int, string, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, b := testenv.Do(t, nil, req)
	var e api.ErrorBody
	_ = json.Unmarshal(b, &e)
	return resp.StatusCode, e.Error.Code, e.Error.Message
}

func bearerHdr(key string) map[string]string {
	return map[string]string{"Authorization": "Bearer " + key, "Content-Type": "application/json"}
}

// recordingCell owns every shard; it counts what reaches it and remembers the
// last request's Authorization header and stress flag.
type recordingCell struct {
	hits   atomic.Int64
	auth   atomic.Value // string
	stress atomic.Bool
}

func startRecordingCell(t *testing.T) (*recordingCell, *fixedRoutes) {
	c := &recordingCell{}
	c.auth.Store("")
	signer := api.NewSigner(testSecret)
	addr := serveCell(t, func(rc *fasthttp.RequestCtx) {
		c.hits.Add(1)
		c.auth.Store(string(rc.Request.Header.Peek("Authorization")))
		c.stress.Store(api.IsStress(&rc.Request.Header))
		if !signer.VerifyRequest(&rc.Request, time.Now()) {
			t.Errorf("router forwarded %s unsigned", rc.RequestURI())
		}
		rc.SetStatusCode(200)
		rc.SetBodyString(`{}`)
	})
	all, _ := sharding.ParseRanges("0-999")
	routes := &fixedRoutes{}
	m, _ := sharding.NewMap([]sharding.Cell{{Name: "a", Addr: addr, Shards: all}})
	routes.m.Store(m)
	return c, routes
}

// TestAPIKeysGuardEveryRoute: every public route needs a key with its scope.
// No key, another scheme, a malformed, unknown, forged or revoked key are 401
// UNAUTHENTICATED; a key without the route's scope is 403 PERMISSION_DENIED;
// none of them reaches a cell. A good key is forwarded without its
// Authorization header. /healthz needs no key.
func TestAPIKeysGuardEveryRoute(t *testing.T) {
	cell, routes := startRecordingCell(t)
	url, keys := startRouterKeys(t, routes, nil, nil)
	routesToTry := []struct{ method, path, body, scope string }{
		{"GET", "/v1/accounts/bob", "", "read"},
		{"POST", "/v1/accounts/bob/deposit", `{"amount":1,"order_no":"d1"}`, "deposit"},
		{"POST", "/v1/packets", `{"sender":"bob","amount":1,"count":1,"order_no":"s1"}`, "send"},
		{"GET", "/v1/packets/" + pktID, "", "read"},
		{"POST", "/v1/packets/" + pktID + "/grab", `{"act_id":"bob"}`, "open"},
		{"POST", "/v1/packets/" + pktID + "/open", `{"act_id":"bob"}`, "open"},
		{"POST", "/v1/noop/bob", "", "read"},
		{"PUT", "/v1/identities/chat/u1", `{"phone":"+8613800000001"}`, "identity"},
	}
	forged := testKey[:len(testKey)-2] + "xx"
	if forged == testKey {
		forged = testKey[:len(testKey)-2] + "yy"
	}
	unauthenticated := map[string]map[string]string{
		"no header":       {"Content-Type": "application/json"},
		"basic scheme":    {"Authorization": "Basic " + testKey, "Content-Type": "application/json"},
		"bare key":        {"Authorization": testKey, "Content-Type": "application/json"},
		"empty bearer":    {"Authorization": "Bearer ", "Content-Type": "application/json"},
		"malformed":       bearerHdr("not-a-key"),
		"unknown id":      bearerHdr("rck_000000000000" + testKey[16:]),
		"forged secret":   bearerHdr(forged),
		"admin token":     bearerHdr(testAdminToken),
		"cluster secret":  bearerHdr(testSecret),
		"key of a header": bearerHdr(" " + testKey),
	}
	for _, rt := range routesToTry {
		for name, hdr := range unauthenticated {
			st, code, _ := call(t, rt.method, url+rt.path, rt.body, hdr)
			if st != 401 || code != "UNAUTHENTICATED" {
				t.Errorf("%s %s, %s: %d %s, want 401 UNAUTHENTICATED", rt.method, rt.path, name, st, code)
			}
		}
		st, code, msg := call(t, rt.method, url+rt.path, rt.body, bearerHdr(readerKey))
		if rt.scope == "read" && st != 200 || rt.scope != "read" && (st != 403 || code != "PERMISSION_DENIED" || !strings.Contains(msg, rt.scope)) {
			t.Errorf("%s %s with a read-only key: %d %s %q", rt.method, rt.path, st, code, msg)
		}
	}
	if n := cell.hits.Load(); n != 3 { // the read-only key's three reads
		t.Fatalf("%d refused or read-only requests reached the cell, want 3 reads", n)
	}
	for _, rt := range routesToTry {
		if st, code, _ := call(t, rt.method, url+rt.path, rt.body, map[string]string{
			"Authorization": "bearer " + testKey, "Content-Type": "application/json"}); st != 200 {
			t.Errorf("%s %s with a good key: %d %s", rt.method, rt.path, st, code)
		}
		if got := cell.auth.Load().(string); got != "" {
			t.Errorf("%s %s: the cell got the caller's Authorization header %q", rt.method, rt.path, got)
		}
	}
	if st, _, _ := call(t, "GET", url+"/healthz", "", nil); st != 200 {
		t.Errorf("/healthz without a key: %d", st)
	}
	// Without any key the answer says one is required, and names the scheme.
	resp, err := http.Get(url + "/v1/accounts/bob")
	if err != nil {
		t.Fatal(err)
	}
	var e api.ErrorBody
	_ = json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if resp.StatusCode != 401 || !strings.Contains(e.Error.Message, "API key is required") || resp.Header.Get("WWW-Authenticate") != `Bearer realm="redcell"` {
		t.Errorf("no key: %d %q, WWW-Authenticate %q", resp.StatusCode, e.Error.Message, resp.Header.Get("WWW-Authenticate"))
	}
	// Revoked: refused at once by the router that revoked it.
	if _, err := keys.Revoke(readerEntry.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	if st, code, _ := call(t, "GET", url+"/v1/accounts/bob", "", bearerHdr(readerKey)); st != 401 || code != "UNAUTHENTICATED" {
		t.Errorf("revoked key: %d %s", st, code)
	}
}

// TestAdminKeys: the router's admin port adds, lists and revokes API keys with
// the admin token (none: 403 ADMIN_DISABLED; wrong or missing: 401), keeps
// only hashes in the key file, and a second router sharing the file takes a
// new key and a revocation within its reload interval. /metrics is on the
// admin port without a token, and gone from the public port.
func TestAdminKeys(t *testing.T) {
	_, routes := startRecordingCell(t)
	url, keys := startRouterKeys(t, routes, nil, nil)
	adminV, _ := adminURLs.Load(url)
	admin := adminV.(string)
	tokenHdr := map[string]string{"Authorization": "Bearer " + testAdminToken, "Content-Type": "application/json"}

	for name, hdr := range map[string]map[string]string{"no token": nil, "wrong token": bearerHdr(testAdminToken + "x"), "an API key": bearerHdr(testKey)} {
		if st, code, _ := call(t, "POST", admin+"/admin/keys", `{"app":"x","scopes":["read"]}`, hdr); st != 401 || code != "UNAUTHENTICATED" {
			t.Errorf("POST /admin/keys, %s: %d %s", name, st, code)
		}
	}
	for _, body := range []string{`{"app":"bad app","scopes":["read"]}`, `{"app":"x","scopes":[]}`, `{"app":"x","scopes":["payout"]}`, `{"app":"x","scopes":["read"],"extra":1}`, `[]`} {
		if st, code, _ := call(t, "POST", admin+"/admin/keys", body, tokenHdr); st != 400 || code != "INVALID_ARGUMENT" {
			t.Errorf("POST /admin/keys %s: %d %s, want 400", body, st, code)
		}
	}
	req, _ := http.NewRequest("POST", admin+"/admin/keys", strings.NewReader(`{"app":"shop","scopes":["read","open"]}`))
	for k, v := range tokenHdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var made KeyResponse
	_ = json.NewDecoder(resp.Body).Decode(&made)
	resp.Body.Close()
	if resp.StatusCode != 200 || made.App != "shop" || !strings.HasPrefix(made.APIKey, "rck_"+made.ID+"_") {
		t.Fatalf("POST /admin/keys: %d %+v", resp.StatusCode, made)
	}
	if st, _, _ := call(t, "POST", url+"/v1/packets/"+pktID+"/open", `{"act_id":"bob"}`, bearerHdr(made.APIKey)); st != 200 {
		t.Errorf("new key, granted scope: %d", st)
	}
	if st, code, _ := call(t, "POST", url+"/v1/accounts/bob/deposit", `{"amount":1,"order_no":"d"}`, bearerHdr(made.APIKey)); st != 403 || code != "PERMISSION_DENIED" {
		t.Errorf("new key, scope not granted: %d %s", st, code)
	}
	raw, _ := os.ReadFile(keys.Path())
	if strings.Contains(string(raw), made.APIKey[17:]) {
		t.Fatal("the key file holds a key")
	}
	// Listed without hashes; the list answer never carries a key.
	req, _ = http.NewRequest("GET", admin+"/admin/keys", nil)
	req.Header.Set("Authorization", "Bearer "+testAdminToken)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	listed, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(listed), `"id":"`+made.ID+`"`) || strings.Contains(string(listed), "sha256") || strings.Contains(string(listed), "rck_") {
		t.Errorf("GET /admin/keys: %s", listed)
	}

	// A second router on the same file, reloading it as redcell router does.
	second := startRouterOnFile(t, routes, keys.Path())
	if st, _, _ := call(t, "GET", second+"/v1/accounts/bob", "", bearerHdr(made.APIKey)); st != 200 {
		t.Errorf("second router, new key: %d", st)
	}
	if st, code, _ := call(t, "DELETE", admin+"/admin/keys/"+made.ID, "", tokenHdr); st != 200 || code != "" {
		t.Fatalf("DELETE /admin/keys/%s: %d %s", made.ID, st, code)
	}
	if st, code, _ := call(t, "DELETE", admin+"/admin/keys/ffffffffffff", "", tokenHdr); st != 404 || code != "NOT_FOUND" {
		t.Errorf("DELETE an unknown id: %d %s", st, code)
	}
	if st, code, _ := call(t, "GET", url+"/v1/accounts/bob", "", bearerHdr(made.APIKey)); st != 401 || code != "UNAUTHENTICATED" {
		t.Errorf("revoked, first router: %d %s", st, code)
	}
	testenv.WaitFor(t, 10*time.Second, "the second router to refuse the revoked key", func() bool {
		st, _, _ := call(t, "GET", second+"/v1/accounts/bob", "", bearerHdr(made.APIKey))
		return st == 401
	})

	if st, code, _ := call(t, "GET", url+"/metrics", "", bearerHdr(testKey)); st != 404 || code != "NOT_FOUND" {
		t.Errorf("/metrics on the public port: %d %s", st, code)
	}
	if exposition := scrape(t, url); !strings.Contains(exposition, "redcell_router_request_duration_seconds") {
		t.Errorf("admin /metrics without the router's series")
	}

	// No admin token configured: every admin route but /metrics is refused.
	bare := startRouterWith(t, routes, func(c *Config) { c.AdminToken = "" }, nil)
	bareAdmin, _ := adminURLs.Load(bare)
	if st, code, _ := call(t, "GET", bareAdmin.(string)+"/admin/keys", "", tokenHdr); st != 403 || code != "ADMIN_DISABLED" {
		t.Errorf("no admin token: %d %s", st, code)
	}
	if st, _, _ := call(t, "GET", bareAdmin.(string)+"/metrics", "", nil); st != 200 {
		t.Errorf("no admin token, /metrics: %d", st)
	}
}

// startRouterOnFile starts a router on an existing key file, reloading it
// every 50 ms as redcell router does every second, and returns its public URL.
func startRouterOnFile(t *testing.T, routes Routes, path string) string {
	return startRouterLogged(t, routes, path, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// startRouterLogged is startRouterOnFile with the router's log.
func startRouterLogged(t *testing.T, routes Routes, path string, log *slog.Logger) string {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Listen, cfg.ClusterSecret = "127.0.0.1:0", testSecret
	keys, err := apikey.Open(path, log)
	if err != nil {
		t.Fatal(err)
	}
	return launchRouter(t, cfg, routes, keys, log, nil, 50*time.Millisecond)
}

// TestStressMarkNeedsSignature: a client may mark a request as stress traffic
// only when it signs it with the cluster secret (as redcell bench does):
// unsigned, signed with another secret, signed stale or over another body, it
// is 403 PERMISSION_DENIED and reaches no cell; signed, it is forwarded as
// stress traffic. Without the mark, nothing needs signing.
func TestStressMarkNeedsSignature(t *testing.T) {
	cell, routes := startRecordingCell(t)
	url := startRouter(t, routes)
	body := `{"amount":100,"order_no":"st-1"}`
	path := "/v1/accounts/bob/deposit"
	sign := func(secret string, ts int64, signedBody string) map[string]string {
		h := bearerHdr(testKey)
		h[api.HeaderStress] = "1"
		h[api.HeaderTimestamp] = strconv.FormatInt(ts, 10)
		h[api.HeaderSignature] = api.Sign([]byte(secret), "POST", path, api.Covered{Stress: true}, ts, []byte(signedBody))
		return h
	}
	now := time.Now().UnixMilli()
	unsigned := bearerHdr(testKey)
	unsigned[api.HeaderStress] = "1"
	for name, hdr := range map[string]map[string]string{
		"unsigned":       unsigned,
		"another secret": sign("another-secret-0123456789", now, body),
		"stale":          sign(testSecret, now-31_000, body),
		"other body":     sign(testSecret, now, `{"amount":1,"order_no":"st-1"}`),
	} {
		st, code, msg := call(t, "POST", url+path, body, hdr)
		if st != 403 || code != "PERMISSION_DENIED" || !strings.Contains(msg, api.HeaderStress) {
			t.Errorf("stress mark, %s: %d %s %q", name, st, code, msg)
		}
	}
	if n := cell.hits.Load(); n != 0 {
		t.Fatalf("%d refused stress requests reached the cell", n)
	}
	if st, code, _ := call(t, "POST", url+path, body, sign(testSecret, time.Now().UnixMilli(), body)); st != 200 || !cell.stress.Load() {
		t.Fatalf("signed stress request: %d %s, forwarded as stress %v", st, code, cell.stress.Load())
	}
	if st, _, _ := call(t, "POST", url+path, body, bearerHdr(testKey)); st != 200 || cell.stress.Load() {
		t.Fatalf("plain request: %d, forwarded as stress %v", st, cell.stress.Load())
	}
}

// TestMediaTypeAndDecodeMessages: a body must be sent as application/json
// (charset=utf-8 allowed, in any case): text, a form, no Content-Type or
// another charset is 415 UNSUPPORTED_MEDIA_TYPE and reaches no cell. A send
// body the router cannot route is 400 with a message in the API's terms, never
// a Go type.
func TestMediaTypeAndDecodeMessages(t *testing.T) {
	cell, routes := startRecordingCell(t)
	url := startRouter(t, routes)
	body := `{"act_id":"bob"}`
	open := url + "/v1/packets/" + pktID + "/open"
	for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
		"application/json; charset=latin1", "application/json; charset=utf-8; x=1", "application/jsonx", "json"} {
		hdr := map[string]string{"Authorization": "Bearer " + testKey}
		if ct != "" {
			hdr["Content-Type"] = ct
		}
		if st, code, _ := call(t, "POST", open, body, hdr); st != 415 || code != "UNSUPPORTED_MEDIA_TYPE" {
			t.Errorf("Content-Type %q: %d %s, want 415 UNSUPPORTED_MEDIA_TYPE", ct, st, code)
		}
	}
	if n := cell.hits.Load(); n != 0 {
		t.Fatalf("%d requests with a wrong media type reached the cell", n)
	}
	for _, ct := range []string{"application/json", "application/json; charset=utf-8", `Application/JSON;charset="UTF-8"`} {
		if st, code, _ := call(t, "POST", open, body, map[string]string{"Authorization": "Bearer " + testKey, "Content-Type": ct}); st != 200 {
			t.Errorf("Content-Type %q: %d %s", ct, st, code)
		}
	}
	if st, _, _ := call(t, "POST", url+"/v1/noop/bob", "", map[string]string{"Authorization": "Bearer " + testKey}); st != 200 {
		t.Errorf("a POST without a body needs no Content-Type: %d", st)
	}

	for body, want := range map[string]string{
		`[]`:                   "the body must be a JSON object",
		`"alice"`:              "the body must be a JSON object",
		`12`:                   "the body must be a JSON object",
		`{"sender":1}`:         "sender must be a string",
		`{"sender":["a"]}`:     "sender must be a string",
		`{"sender":`:           "malformed JSON body",
		`{"sender":"a"} x`:     "malformed JSON body",
		`null`:                 "sender: act_id must be 1..64 characters",
		`{"sender":"a b"}`:     "sender: act_id may hold only ASCII letters, digits, '_' and '-'",
		`{"sender":"a\u00e9"}`: "sender: act_id may hold only ASCII letters, digits, '_' and '-'",
	} {
		st, code, msg := call(t, "POST", url+"/v1/packets", body, bearerHdr(testKey))
		if st != 400 || code != "INVALID_ARGUMENT" || msg != want {
			t.Errorf("send body %s: %d %s %q, want 400 %q", body, st, code, msg, want)
		}
		for _, leak := range []string{"Go ", "struct", "json:", "unmarshal", "[]", "string}"} {
			if strings.Contains(msg, leak) {
				t.Errorf("send body %s: message %q names an internal type (%q)", body, msg, leak)
			}
		}
	}
}

// TestTLS: with a certificate configured, the public and admin ports serve
// HTTPS only.
func TestTLS(t *testing.T) {
	certFile, keyFile, pool := selfSignedCert(t)
	_, routes := startRecordingCell(t)
	url := startRouterWith(t, routes, func(c *Config) { c.TLSCert, c.TLSKey = certFile, keyFile }, nil)
	if !strings.HasPrefix(url, "https://") {
		t.Fatalf("url %s", url)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 5 * time.Second}
	req, _ := http.NewRequest("GET", url+"/v1/accounts/bob", nil)
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.TLS == nil {
		t.Fatalf("over TLS: %d, tls %v", resp.StatusCode, resp.TLS != nil)
	}
	admin, _ := adminURLs.Load(url)
	if resp, err := client.Get(admin.(string) + "/metrics"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("admin over TLS: %v", err)
	} else {
		resp.Body.Close()
	}
	plain := "http://" + strings.TrimPrefix(url, "https://")
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(plain + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("plain HTTP served on a TLS port")
		}
	}
	if err := func() error {
		c := DefaultConfig()
		c.ClusterSecret, c.TLSCert = testSecret, certFile
		return c.Validate()
	}(); err == nil {
		t.Error("a certificate without its key was accepted")
	}
}

// selfSignedCert writes a certificate for 127.0.0.1 and its key, and returns
// their paths and a pool that trusts the certificate.
func selfSignedCert(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "redcell-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}
