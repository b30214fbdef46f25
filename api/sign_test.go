package api

import (
	"bufio"
	"bytes"
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
			want := Sign([]byte(testSecret), c.method, string(got.Header.RequestURI()), stress, now.UnixMilli(), []byte(c.body))
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
