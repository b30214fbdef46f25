// Package strictjson decodes request bodies strictly: one JSON object whose
// text and keys are exactly what the target struct names, or
// ErrInvalidArgument.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"sync"
	"unicode/utf8"

	"redcell/model"
)

// Decode decodes one JSON object into v (a pointer to a struct with json
// tags). Refused, all as ErrInvalidArgument: a body that is not valid UTF-8 or
// that escapes a lone UTF-16 surrogate ("\ud800"), unknown fields, keys in
// another case or given twice (in nested objects too), anything but whitespace
// after the object, strings or floats where integers belong, and int64
// overflow. encoding/json alone would turn bad text into U+FFFD, match keys
// without regard to case and let a repeated key win, all silently; so the text
// and the keys are checked first.
func Decode(body []byte, v any) error { return decode(body, v, true) }

// decode is Decode, with the keys checked by plainKeys first when fast.
func decode(body []byte, v any, fast bool) error {
	if !utf8.Valid(body) {
		return model.Invalidf("the body must be valid UTF-8")
	}
	if loneSurrogate(body) {
		return model.Invalidf("the body escapes a lone UTF-16 surrogate (\\ud800-\\udfff)")
	}
	if t := reflect.TypeOf(v).Elem(); !fast || !plainKeys(body, t) {
		if err := exactKeys(body, t); err != nil {
			return err
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return model.Invalidf("field %q must be %s", te.Field, kindName(te.Type.Kind()))
		}
		return model.Invalidf("malformed JSON body")
	}
	// dec.More is false before a stray ']' or '}', so look at the rest itself.
	if len(bytes.TrimLeft(body[dec.InputOffset():], " \t\r\n")) > 0 {
		return model.Invalidf("trailing data after the JSON body")
	}
	return nil
}

func kindName(k reflect.Kind) string {
	switch k {
	case reflect.Int64, reflect.Int, reflect.Int32:
		return "an integer"
	case reflect.String:
		return "a string"
	case reflect.Slice:
		return "an array"
	case reflect.Struct:
		return "an object"
	}
	return "of another type"
}

// loneSurrogate reports whether body holds a \u escape of a UTF-16 surrogate
// that is not half of a high-low pair; encoding/json would decode it as U+FFFD.
// In valid JSON a backslash occurs only inside a string, as an escape, so body
// is scanned without tracking strings (what is not valid JSON is refused later).
func loneSurrogate(body []byte) bool {
	for i := 0; i < len(body); i++ {
		if body[i] != '\\' {
			continue
		}
		r, ok := escapedRune(body[i:])
		if !ok {
			i++ // a two-character escape such as \\ or \", or malformed
			continue
		}
		switch {
		case r >= 0xdc00 && r <= 0xdfff:
			return true // a low surrogate with no high one before it
		case r >= 0xd800 && r <= 0xdbff:
			if lo, ok := escapedRune(body[i+6:]); !ok || lo < 0xdc00 || lo > 0xdfff {
				return true
			}
			i += 11
		default:
			i += 5
		}
	}
	return false
}

// escapedRune reads a \uXXXX escape at the start of b.
func escapedRune(b []byte) (rune, bool) {
	if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
		return 0, false
	}
	var r rune
	for _, c := range b[2:6] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// exactKeys checks that body is a JSON object whose keys are fields of struct
// type t, spelled exactly, each at most once. The value of a field whose type is
// a struct, or a slice of structs, is checked the same way against that type.
func exactKeys(body []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil {
		return model.Invalidf("malformed JSON body")
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return model.Invalidf("the body must be a JSON object")
	}
	fields := jsonFields(t)
	seen := make(map[string]bool, len(fields))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return model.Invalidf("malformed JSON body")
		}
		key, _ := tok.(string)
		ft, ok := fields[key]
		if !ok {
			return model.Invalidf("unknown field %q", key)
		}
		if seen[key] {
			return model.Invalidf("field %q appears twice", key)
		}
		seen[key] = true
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return model.Invalidf("malformed JSON body")
		}
		if err := nestedKeys(value, ft); err != nil {
			return err
		}
	}
	return nil
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// nestedKeys applies exactKeys to a value meant for type t: an object for a
// struct, an array for a slice of structs. Any other pairing is left to the
// decoder, which refuses a value of the wrong type.
func nestedKeys(value json.RawMessage, t reflect.Type) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if len(value) == 0 || reflect.PointerTo(t).Implements(unmarshalerType) {
		return nil // a type that decodes itself has its own rules
	}
	switch {
	case t.Kind() == reflect.Struct && value[0] == '{':
		return exactKeys(value, t)
	case t.Kind() == reflect.Slice && value[0] == '[':
		var items []json.RawMessage
		if err := json.Unmarshal(value, &items); err != nil {
			return model.Invalidf("malformed JSON body")
		}
		for _, item := range items {
			if err := nestedKeys(item, t.Elem()); err != nil {
				return err
			}
		}
	}
	return nil
}

var fieldsByType sync.Map // reflect.Type -> map[string]reflect.Type

// jsonFields returns the JSON names of struct type t's fields, with their
// types. Embedded structs are not flattened: request types have none.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	if f, ok := fieldsByType.Load(t); ok {
		return f.(map[string]reflect.Type)
	}
	f := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			f[name] = t.Field(i).Type
		}
	}
	fieldsByType.Store(t, f)
	return f
}

// plainKeys is exactKeys' fast path for the common body: it scans the
// top-level object once, without decoding, and answers true only when every
// key is written without escapes, names a field of t exactly and appears
// once, and every nested value meant for a struct passes exactKeys. Any
// other body (an escape in a key, an unknown or repeated key, text the scan
// does not follow) answers false, and exactKeys decides it, so the errors
// are exactKeys' own. Syntax the scan skips over loosely (a misspelt
// literal) is refused by the decoder that runs after it, as "malformed", the
// answer exactKeys would have given: Decode answers as without this path.
func plainKeys(body []byte, t reflect.Type) bool {
	fields := jsonFields(t)
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return false
	}
	i = skipSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		return true
	}
	var seen [16]string // request types have fewer fields
	n := 0
	for i < len(body) {
		if body[i] != '"' {
			return false
		}
		end := i + 1
		for end < len(body) && body[end] != '"' {
			if body[end] == '\\' || body[end] < 0x20 {
				return false
			}
			end++
		}
		if end >= len(body) {
			return false
		}
		key := body[i+1 : end]
		ft, ok := fields[string(key)]
		if !ok || n == len(seen) {
			return false
		}
		for _, k := range seen[:n] {
			if k == string(key) {
				return false
			}
		}
		seen[n] = string(key)
		n++
		i = skipSpace(body, end+1)
		if i >= len(body) || body[i] != ':' {
			return false
		}
		i = skipSpace(body, i+1)
		vend := skipValue(body, i)
		if vend < 0 {
			return false
		}
		if body[i] == '{' || body[i] == '[' {
			if nestedKeys(body[i:vend], ft) != nil {
				return false
			}
		}
		i = skipSpace(body, vend)
		if i >= len(body) {
			return false
		}
		switch body[i] {
		case '}':
			return true
		case ',':
			i = skipSpace(body, i+1)
		default:
			return false
		}
	}
	return false
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the index just past the JSON value starting at i, or -1
// where the scan cannot follow it. It checks only what it needs to find the
// value's end: strings and their escapes, and the nesting of objects and
// arrays.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				if i = skipString(b, i); i < 0 {
					return -1
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return -1
	}
	start := i
	for i < len(b) && (b[i] >= '0' && b[i] <= '9' || b[i] >= 'a' && b[i] <= 'z' || b[i] == '-' || b[i] == '+' || b[i] == '.' || b[i] == 'E') {
		i++
	}
	if i == start {
		return -1
	}
	return i
}

// skipString returns the index just past the string starting at b[i] ('"'),
// or -1 when it does not end.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}
