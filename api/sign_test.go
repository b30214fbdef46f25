package api

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

const testSecret = "s3cret-s3cret-s3cret"

// onTheWire sends req through fasthttp's writer and reader, so the result is
// the request a cell's server sees: its raw request line, headers and body.
func onTheWire(t *testing.T, req *fasthttp.Request) *fasthttp.Request {
	t.Helper()
	var buf bytes.Buffer
	w := bufio.NewWriter(&buf)
	if err := req.Write(w); err != nil {
		t.Fatal(err)
	}
	w.Flush()
	got := &fasthttp.Request{}
	if err := got.Read(bufio.NewReader(&buf)); err != nil {
		t.Fatal(err)
	}
	return got
}

func newReq(method, uri, body string, stress bool) *fasthttp.Request {
	req := &fasthttp.Request{}
	req.Header.SetMethod(method)
	req.SetRequestURI(uri)
	if stress {
		req.Header.Set(HeaderStress, "1")
	}
	if body != "" {
		req.SetBodyString(body)
	}
	return req
}

func TestSignRequestVerifies(t *testing.T) {
	s := NewSigner(testSecret)
	now := time.UnixMilli(1_800_000_000_000)
	for _, c := range []struct{ method, uri, body string }{
		{"POST", "http://127.0.0.1:9101/internal/credits", `{"credits":[]}`},
		{"GET", "http://127.0.0.1:9101/v1/packets/2026112928984d4126a33f01cd3?after=2&limit=5", ""},
		{"POST", "http://127.0.0.1:9101/v1/packets/2026112928984d4126a33f01cd3/open", `{"act_id":"bob"}`},
		{"GET", "http://127.0.0.1:9101/v1/accounts/../accounts/bob", ""}, // normalized before signing and sending
	} {
		for _, stress := range []bool{false, true} {
			req := newReq(c.method, c.uri, c.body, stress)
			s.SignRequest(req, now)
			got := onTheWire(t, req)
			if !s.VerifyRequest(got, now.Add(time.Second)) {
				t.Errorf("%s %s (stress %v): a fresh, correct signature was refused", c.method, c.uri, stress)
			}
			// The reference function agrees with the signer.
			want := Sign([]byte(testSecret), c.method, string(got.Header.RequestURI()), Covered{Stress: stress}, now.UnixMilli(), []byte(c.body))
			if string(got.Header.Peek(HeaderSignature)) != want {
				t.Errorf("%s %s: SignRequest and Sign differ", c.method, c.uri)
			}
		}
	}
}

func TestVerifyRequestRefuses(t *testing.T) {
	s := NewSigner(testSecret)
	now := time.UnixMilli(1_800_000_000_000)
	const uri = "http://127.0.0.1:9101/v1/packets/2026112928984d4126a33f01cd3?after=2&limit=5"
	signed := func(tune func(*fasthttp.Request)) *fasthttp.Request {
		req := newReq("POST", uri, `{"act_id":"bob"}`, false)
		s.SignRequest(req, now)
		got := onTheWire(t, req)
		if tune != nil {
			tune(got)
		}
		return got
	}
	for name, c := range map[string]struct {
		req *fasthttp.Request
		at  time.Time
		by  *Signer
	}{
		"other body":       {req: signed(func(r *fasthttp.Request) { r.SetBodyString(`{"act_id":"eve"}`) })},
		"other path":       {req: signed(func(r *fasthttp.Request) { r.SetRequestURI("/v1/packets/2026112928984d4126a33f01cd4?after=2&limit=5") })},
		"other query":      {req: signed(func(r *fasthttp.Request) { r.SetRequestURI("/v1/packets/2026112928984d4126a33f01cd3?after=0&limit=5") })},
		"other method":     {req: signed(func(r *fasthttp.Request) { r.Header.SetMethod("PUT") })},
		"other space":      {req: signed(func(r *fasthttp.Request) { r.Header.Set(HeaderStress, "1") })},
		"app added":        {req: signed(func(r *fasthttp.Request) { r.Header.Set(HeaderApp, "chat") })},
		"partial added":    {req: signed(func(r *fasthttp.Request) { r.Header.Set(HeaderPartial, "1") })},
		"other secret":     {req: signed(nil), by: NewSigner("another-secret-0123456789")},
		"no secret":        {req: signed(nil), by: NewSigner("")},
		"replayed later":   {req: signed(nil), at: now.Add(SignatureWindow + time.Second)},
		"from the future":  {req: signed(nil), at: now.Add(-SignatureWindow - time.Second)},
		"no timestamp":     {req: signed(func(r *fasthttp.Request) { r.Header.Del(HeaderTimestamp) })},
		"bad timestamp":    {req: signed(func(r *fasthttp.Request) { r.Header.Set(HeaderTimestamp, "-1800000000000") })},
		"moved timestamp":  {req: signed(func(r *fasthttp.Request) { r.Header.Set(HeaderTimestamp, strconv.FormatInt(now.UnixMilli()+1, 10)) })},
		"no signature":     {req: signed(func(r *fasthttp.Request) { r.Header.Del(HeaderSignature) })},
		"short signature":  {req: signed(func(r *fasthttp.Request) { r.Header.Set(HeaderSignature, "abcd") })},
		"unsigned request": {req: onTheWire(t, newReq("POST", uri, `{"act_id":"bob"}`, false))},
	} {
		by, at := c.by, c.at
		if by == nil {
			by = s
		}
		if at.IsZero() {
			at = now
		}
		if by.VerifyRequest(c.req, at) {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestSignatureCoversAuthorityHeaders: the headers that carry authority at a
// cell — the app a coupon request is stored under, the partial flag of the
// credits route, the stress mark — are signed: a call signed with them
// verifies, and the same call with one changed, removed or added is refused,
// so a captured call cannot be replayed under another app's name. The
// reference function agrees; a call with none of them signs as it did before
// they were covered (the golden value), and a line break set in a covered
// header cannot make it pass for another header's line.
func TestSignatureCoversAuthorityHeaders(t *testing.T) {
	s := NewSigner(testSecret)
	now := time.UnixMilli(1_800_000_000_000)
	const uri = "http://127.0.0.1:9101/v1/coupons/issue"
	const body = `{"serial_no":"s1","batch_id":"b1","act_id":"bob"}`
	signed := func(app, partial string, stress bool) *fasthttp.Request {
		req := newReq("POST", uri, body, stress)
		if app != "" {
			req.Header.Set(HeaderApp, app)
		}
		if partial != "" {
			req.Header.Set(HeaderPartial, partial)
		}
		s.SignRequest(req, now)
		return onTheWire(t, req)
	}
	for _, c := range []struct {
		app, partial string
		stress       bool
	}{{"chat", "", false}, {"chat", "", true}, {"", "1", false}, {"shop", "1", true}} {
		req := signed(c.app, c.partial, c.stress)
		if !s.VerifyRequest(req, now) {
			t.Errorf("%+v: refused as signed", c)
		}
		want := Sign([]byte(testSecret), "POST", "/v1/coupons/issue", Covered{Stress: c.stress, App: c.app, Partial: c.partial}, now.UnixMilli(), []byte(body))
		if string(req.Header.Peek(HeaderSignature)) != want {
			t.Errorf("%+v: SignRequest and Sign differ", c)
		}
	}
	for name, tune := range map[string]func(*fasthttp.Request){
		"app changed":          func(r *fasthttp.Request) { r.Header.Set(HeaderApp, "shop") },
		"app changed in case":  func(r *fasthttp.Request) { r.Header.Set(HeaderApp, "Chat") },
		"app removed":          func(r *fasthttp.Request) { r.Header.Del(HeaderApp) },
		"partial added":        func(r *fasthttp.Request) { r.Header.Set(HeaderPartial, "1") },
		"stress added":         func(r *fasthttp.Request) { r.Header.Set(HeaderStress, "1") },
		"app moved to partial": func(r *fasthttp.Request) { r.Header.Del(HeaderApp); r.Header.Set(HeaderPartial, "chat") },
	} {
		req := signed("chat", "", false)
		tune(req)
		if s.VerifyRequest(req, now) {
			t.Errorf("%s: accepted", name)
		}
	}
	partial := signed("", "1", false)
	partial.Header.Del(HeaderPartial)
	if s.VerifyRequest(partial, now) {
		t.Error("partial removed: accepted")
	}
	// App "chat\npartial:1" without a partial header would sign as app
	// "chat" with partial "1" if the line break stayed; fasthttp keeps none.
	req := newReq("POST", uri, body, false)
	req.Header.Set(HeaderApp, "chat")
	req.Header.Set(HeaderPartial, "1")
	s.SignRequest(req, now)
	req.Header.Del(HeaderPartial)
	req.Header.Set(HeaderApp, "chat\npartial:1")
	if s.VerifyRequest(req, now) || bytes.ContainsAny(req.Header.Peek(HeaderApp), "\r\n") {
		t.Errorf("app %q with a line break: accepted", req.Header.Peek(HeaderApp))
	}
	// Golden: a call without app or partial signs over the same text as
	// before they were covered, so routers and cells of both versions agree
	// on every call but the coupon routes and relayed credits.
	old := hmac.New(sha256.New, []byte(testSecret))
	old.Write([]byte("GET\n/v1/accounts/bob\nreal\n1800000000000\n"))
	if got := Sign([]byte(testSecret), "GET", "/v1/accounts/bob", Covered{}, now.UnixMilli(), nil); got != hex.EncodeToString(old.Sum(nil)) {
		t.Errorf("a call without covered headers signs as %s, want the earlier text's %x", got, old.Sum(nil))
	}
}

// TestSignRequestReplacesHeaders: a client's own signature headers never reach
// the cell next to the router's.
func TestSignRequestReplacesHeaders(t *testing.T) {
	s := NewSigner(testSecret)
	now := time.UnixMilli(1_800_000_000_000)
	req := newReq("GET", "http://127.0.0.1:9101/v1/accounts/bob", "", false)
	req.Header.Set(HeaderTimestamp, "1")
	req.Header.Set(HeaderSignature, "forged")
	s.SignRequest(req, now)
	got := onTheWire(t, req)
	if string(got.Header.Peek(HeaderTimestamp)) != "1800000000000" || !s.VerifyRequest(got, now) {
		t.Fatalf("client headers kept: %s", got.Header.Header())
	}
}

// TestSignerAllocs: the router signs every forwarded request; neither side
// makes garbage for it.
func TestSignerAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	s := NewSigner(testSecret)
	now := time.UnixMilli(1_800_000_000_000)
	req := newReq("POST", "http://127.0.0.1:9101/v1/packets/2026112928984d4126a33f01cd3/open", `{"act_id":"bob"}`, true)
	req.Header.Set(HeaderApp, "chat") // the covered headers cost nothing either
	req.Header.Set(HeaderPartial, "1")
	s.SignRequest(req, now) // the header and URI buffers grow once
	got := onTheWire(t, req)
	if n := testing.AllocsPerRun(100, func() { s.SignRequest(req, now) }); n != 0 {
		t.Errorf("SignRequest: %v allocations", n)
	}
	if n := testing.AllocsPerRun(100, func() {
		if !s.VerifyRequest(got, now) {
			t.Fatal("refused")
		}
	}); n != 0 {
		t.Errorf("VerifyRequest: %v allocations", n)
	}
}

func BenchmarkSignRequest(b *testing.B) {
	s := NewSigner(testSecret)
	req := newReq("POST", "http://127.0.0.1:9101/v1/packets/2026112928984d4126a33f01cd3/open", `{"act_id":"bob"}`, false)
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		s.SignRequest(req, now)
	}
}
