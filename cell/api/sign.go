package api

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"
)

// Headers of a signed internal call (cell to cell).
const (
	HeaderTimestamp = "X-Redcell-Timestamp" // Unix ms when the call was signed
	HeaderSignature = "X-Redcell-Signature" // hex HMAC-SHA256, see Sign
)

// SignatureWindow is how far a signed call's timestamp may be from the
// receiver's clock; older (replayed) or future calls are refused.
const SignatureWindow = 30 * time.Second

// Sign returns the HMAC-SHA256, keyed with the cluster secret, over the method,
// path, money space (stress traffic or real: the HeaderStress flag, which picks
// the tables), timestamp (Unix ms) and body of an internal call, hex-encoded.
// Signing the space means a call cannot be replayed into the other one.
func Sign(secret []byte, method, path string, stress bool, tsMS int64, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(method))
	m.Write([]byte{'\n'})
	m.Write([]byte(path))
	m.Write([]byte{'\n'})
	if stress {
		m.Write([]byte("stress\n"))
	} else {
		m.Write([]byte("real\n"))
	}
	m.Write(strconv.AppendInt(nil, tsMS, 10))
	m.Write([]byte{'\n'})
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// Verify checks a signed call at time now. It fails on an empty secret, a
// missing or malformed timestamp, a timestamp outside SignatureWindow, or a
// signature that does not match (compared in constant time).
func Verify(secret []byte, method, path string, stress bool, tsHeader, sigHeader string, body []byte, now time.Time) bool {
	if len(secret) == 0 || tsHeader == "" || sigHeader == "" {
		return false
	}
	ts, err := strconv.ParseInt(tsHeader, 10, 64)
	if err != nil {
		return false
	}
	if d := now.Sub(time.UnixMilli(ts)); d > SignatureWindow || d < -SignatureWindow {
		return false
	}
	want := Sign(secret, method, path, stress, ts, body)
	return hmac.Equal([]byte(want), []byte(sigHeader))
}
