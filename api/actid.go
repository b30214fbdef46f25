package api

// ScanActID reads the body of grab and open, {"act_id": "..."}, without
// reflection or allocation beyond the returned string: it is on the hot path of
// the router and the cell. It matches exactly
//
//	ws { ws "act_id" ws : ws "<chars, no \ or " or control or non-ASCII>" ws } ws
//
// and reports false for anything else (other keys, escapes, trailing data),
// which the caller then decodes the slow way.
func ScanActID(b []byte) (string, bool) {
	i := skipWS(b, 0)
	const key = `"act_id"`
	if i >= len(b) || b[i] != '{' {
		return "", false
	}
	i = skipWS(b, i+1)
	if len(b)-i < len(key) || string(b[i:i+len(key)]) != key {
		return "", false
	}
	i = skipWS(b, i+len(key))
	if i >= len(b) || b[i] != ':' {
		return "", false
	}
	i = skipWS(b, i+1)
	if i >= len(b) || b[i] != '"' {
		return "", false
	}
	start := i + 1
	for i = start; i < len(b) && b[i] != '"'; i++ {
		if b[i] == '\\' || b[i] < 0x20 || b[i] >= 0x7f {
			return "", false
		}
	}
	if i >= len(b) {
		return "", false
	}
	id := string(b[start:i])
	i = skipWS(b, i+1)
	if i >= len(b) || b[i] != '}' || skipWS(b, i+1) != len(b) {
		return "", false
	}
	return id, true
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
