package api

import (
	"bytes"
	"sort"
)

// CodeOK labels a successful answer in metrics; it is never sent as an error code.
const CodeOK = "OK"

// CodeOther labels, in metrics, an answer whose error code is not in the table
// (or that carries no error body): metric label values stay a fixed set.
const CodeOther = "OTHER"

// Codes returns every error code of the status table, sorted. Metrics use it to
// fix their label values in advance.
func Codes() []string {
	out := make([]string, 0, len(status))
	for c := range status {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

// errorPrefix starts every error body ErrorJSON renders: encoding/json writes
// the fields in struct order.
var errorPrefix = []byte(`{"error":{"code":"`)

// ErrorCode returns the code of an error body made by ErrorJSON, or nil when body
// is not one. It does not allocate: it returns a slice of body.
func ErrorCode(body []byte) []byte {
	if !bytes.HasPrefix(body, errorPrefix) {
		return nil
	}
	rest := body[len(errorPrefix):]
	end := bytes.IndexByte(rest, '"')
	if end < 0 {
		return nil
	}
	return rest[:end]
}
