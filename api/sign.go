package api

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// Headers of a signed call to a cell: every request a router forwards, every
// credit a cell relays, every request the bench sends a cell directly.
const (
	HeaderTimestamp = "X-Redcell-Timestamp" // Unix ms when the call was signed
	HeaderSignature = "X-Redcell-Signature" // hex HMAC-SHA256, see Sign
)

// SignatureWindow is how far a signed call's timestamp may be from the
// receiver's clock; older (replayed) or future calls are refused.
const SignatureWindow = 30 * time.Second

// Covered is what a signature covers of a call's headers besides its
// timestamp: each header that carries authority at the cell. Stress
// (HeaderStress "1") picks real or shadow money; App (HeaderApp) is the app a
// coupon request is stored and found under; Partial (HeaderPartial) lets the
// credits route answer 200 with part of a batch applied, which only a sender
// that reads the deferred list may be told. The deadline header is not here:
// a cell takes the earlier of it and its own timeout, so changing it can only
// cut a call short.
type Covered struct {
	Stress       bool
	App, Partial string // the header's value as sent; "" when absent
}

// Sign returns the HMAC-SHA256, keyed with the cluster secret, over the method,
// request target (the path and query string exactly as sent on the request
// line), money space (stress traffic or real: the HeaderStress flag, which picks
// the tables), the headers of c that are set, timestamp (Unix ms) and body of a
// call, hex-encoded: the hex of
//
//	HMAC(secret, METHOD "\n" TARGET "\n" SPACE "\n" ["app:" APP "\n"] ["partial:" PARTIAL "\n"] TIMESTAMP "\n" BODY)
//
// SPACE being "stress" or "real", and each bracketed line there only when its
// header has a value. Signing the space means a call cannot be replayed into
// the other one; signing the app, that it cannot be replayed under another
// app's name. A call without App and Partial signs as before they were
// covered. Signer computes the same without allocating.
func Sign(secret []byte, method, target string, c Covered, tsMS int64, body []byte) string {
	m := hmac.New(sha256.New, secret)
	writeSigned(m, []byte(method), []byte(target), c.Stress, []byte(c.App), []byte(c.Partial), strconv.AppendInt(nil, tsMS, 10), body)
	return hex.EncodeToString(m.Sum(nil))
}

// writeSigned writes what a signature covers into m; Sign and Signer share it
// so that both compute one thing. The header lines cannot be taken for the
// timestamp's (it is digits only) nor for each other: their values hold no
// line break (none comes off the wire, and fasthttp turns one a caller sets
// into a space).
func writeSigned(m hash.Hash, method, target []byte, stress bool, app, partial, ts, body []byte) {
	m.Write(method)
	m.Write(newline)
	m.Write(target)
	m.Write(newline)
	if stress {
		m.Write(spaceStress)
	} else {
		m.Write(spaceReal)
	}
	if len(app) > 0 {
		m.Write(labelApp)
		m.Write(app)
		m.Write(newline)
	}
	if len(partial) > 0 {
		m.Write(labelPartial)
		m.Write(partial)
		m.Write(newline)
	}
	m.Write(ts)
	m.Write(newline)
	m.Write(body)
}

var (
	newline      = []byte{'\n'}
	spaceStress  = []byte("stress\n")
	spaceReal    = []byte("real\n")
	labelApp     = []byte("app:")
	labelPartial = []byte("partial:")
)

// IsStress reports whether a request is stress-test traffic (HeaderStress
// "1"). Cells pick the shadow tables by it and signatures cover it.
func IsStress(h *fasthttp.RequestHeader) bool {
	v := h.Peek(HeaderStress)
	return len(v) == 1 && v[0] == '1'
}

// Signer signs requests to cells and checks them, with the cluster secret.
// Create it with NewSigner. It is safe for concurrent use, and signs and checks
// without allocating (the router signs every request it forwards).
type Signer struct {
	secret []byte
	states sync.Pool // *signState keyed with secret
}

// signState is one HMAC in use and its scratch space; pooled, so that a
// signature costs no garbage.
type signState struct {
	mac hash.Hash
	sum [sha256.Size]byte
	hex [2 * sha256.Size]byte
	ts  [20]byte
}

// NewSigner returns a signer keyed with secret. With an empty secret it signs
// nothing and VerifyRequest refuses everything: a cell without a secret fails
// closed (cell.Config.Validate also refuses to start one).
func NewSigner(secret string) *Signer {
	s := &Signer{secret: []byte(secret)}
	s.states.New = func() any { return &signState{mac: hmac.New(sha256.New, s.secret)} }
	return s
}

// SignRequest sets HeaderTimestamp (now, Unix ms) and HeaderSignature on req,
// replacing any the request carried. What it signs is what the cell checks:
// req's method, request target (req.URI().RequestURI(), which is what fasthttp
// writes on the request line), HeaderStress, HeaderApp, HeaderPartial and
// body (see Sign). Call it after these are final: changing any of them
// afterwards makes the cell refuse the request.
func (s *Signer) SignRequest(req *fasthttp.Request, now time.Time) {
	if len(s.secret) == 0 {
		return // nothing to sign with; the cell refuses the call
	}
	st := s.states.Get().(*signState)
	defer s.states.Put(st)
	ts := strconv.AppendInt(st.ts[:0], now.UnixMilli(), 10)
	req.Header.SetBytesV(HeaderTimestamp, ts)
	req.Header.SetBytesV(HeaderSignature, s.sign(st, req.Header.Method(), req.URI().RequestURI(), &req.Header, ts, req.Body()))
}

// VerifyRequest checks a request a cell received at time now: it must carry a
// timestamp within SignatureWindow of now and a signature by the cluster
// secret over the method, the raw request target of the request line, the
// money space, the app and partial headers and the body (see Sign). It fails on
// an empty secret, a missing or malformed header, a timestamp outside the
// window (a replay, or a clock far off) and a signature that does not match
// (compared in constant time).
func (s *Signer) VerifyRequest(req *fasthttp.Request, now time.Time) bool {
	tsHeader, sig := req.Header.Peek(HeaderTimestamp), req.Header.Peek(HeaderSignature)
	if len(s.secret) == 0 || len(sig) != 2*sha256.Size {
		return false
	}
	ms, err := fasthttp.ParseUint(tsHeader)
	if err != nil {
		return false
	}
	if d := now.Sub(time.UnixMilli(int64(ms))); d > SignatureWindow || d < -SignatureWindow {
		return false
	}
	st := s.states.Get().(*signState)
	defer s.states.Put(st)
	want := s.sign(st, req.Header.Method(), req.Header.RequestURI(), &req.Header, tsHeader, req.Body())
	return hmac.Equal(want, sig)
}

// sign returns the hex signature in st's scratch space, over the covered
// headers of h.
func (s *Signer) sign(st *signState, method, target []byte, h *fasthttp.RequestHeader, ts, body []byte) []byte {
	st.mac.Reset()
	writeSigned(st.mac, method, target, IsStress(h), h.Peek(HeaderApp), h.Peek(HeaderPartial), ts, body)
	hex.Encode(st.hex[:], st.mac.Sum(st.sum[:0]))
	return st.hex[:]
}
