package bench

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
)

// CPUProfile summarizes a Go CPU profile of a server taken while the bench
// loaded it: how busy it was, its CPU per request, and where the CPU went.
type CPUProfile struct {
	URL     string  `json:"url"`
	Seconds float64 `json:"seconds"` // how long the profile ran
	// CPUSeconds is the CPU time sampled (all threads); CoresBusy is
	// CPUSeconds / Seconds.
	CPUSeconds float64 `json:"cpu_seconds"`
	CoresBusy  float64 `json:"cores_busy"`
	// CPUMicrosPerRequest is CPUSeconds over the requests the profile saw,
	// estimated from the measurement's rate (perRequest); 0 when unknown.
	CPUMicrosPerRequest float64 `json:"cpu_us_per_request,omitempty"`
	// Flat are the functions with the most CPU of their own; Cum those with
	// the most CPU including what they call. Both at most profileTop.
	Flat  []ProfileFunc `json:"flat"`
	Cum   []ProfileFunc `json:"cum"`
	Error string        `json:"error,omitempty"`
}

// ProfileFunc is one function's share of a profile.
type ProfileFunc struct {
	Name string  `json:"name"`
	MS   float64 `json:"ms"`  // CPU milliseconds
	Pct  float64 `json:"pct"` // of the profile's CPU, 0..100
}

// profileTop is how many functions a summary lists per ordering.
const profileTop = 15

// profileLead is how long after a measurement starts its profile starts, so
// that connecting does not count; the profile ends profileLead before the
// measurement does.
const profileLead = 500 * time.Millisecond

// profileDuring starts profiling the Go process serving net/http/pprof on
// addr (host:port) for about d (the measurement about to start), in the
// background; the summary comes on the channel when the profile is done.
func profileDuring(ctx context.Context, addr string, d time.Duration) <-chan CPUProfile {
	out := make(chan CPUProfile, 1)
	secs := max(1, int((d-2*profileLead)/time.Second))
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, secs)
	go func() {
		p := CPUProfile{URL: url, Seconds: float64(secs)}
		select {
		case <-time.After(profileLead):
		case <-ctx.Done():
			p.Error = ctx.Err().Error()
			out <- p
			return
		}
		if err := p.fetch(ctx, url); err != nil {
			p.Error = err.Error()
		}
		out <- p
	}()
	return out
}

func (p *CPUProfile) fetch(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(p.Seconds)*time.Second+10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("bench: profile: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("bench: profile: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("bench: profile %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return p.summarize(body)
}

// perRequest sets CPUMicrosPerRequest from the measurement's rate.
func (p *CPUProfile) perRequest(perSec float64) {
	if perSec > 0 && p.Seconds > 0 && p.Error == "" {
		p.CPUMicrosPerRequest = p.CPUSeconds * 1e6 / (perSec * p.Seconds)
	}
}

// summarize reads a profile as net/http/pprof serves it (gzipped
// profile.proto) and fills the totals and the top functions.
func (p *CPUProfile) summarize(raw []byte) error {
	if zr, err := gzip.NewReader(bytes.NewReader(raw)); err == nil {
		if raw, err = io.ReadAll(zr); err != nil {
			return fmt.Errorf("bench: profile: %w", err)
		}
	}
	pr, err := parseProfile(raw)
	if err != nil {
		return err
	}
	vi := len(pr.sampleTypes) - 1 // Go's CPU profile: samples/count, cpu/nanoseconds
	if vi < 0 || pr.str(pr.sampleTypes[vi]) != "cpu" {
		return errors.New("bench: profile: not a CPU profile")
	}
	flat, cum := map[string]int64{}, map[string]int64{}
	var total int64
	for _, s := range pr.samples {
		if vi >= len(s.values) {
			continue
		}
		v := s.values[vi]
		total += v
		seen := map[string]bool{}
		for i, loc := range s.locs {
			fns := pr.locFuncs[loc] // innermost first (inlined calls)
			for j, fn := range fns {
				name := pr.str(pr.funcNames[fn])
				if i == 0 && j == 0 {
					flat[name] += v
				}
				if !seen[name] {
					seen[name] = true
					cum[name] += v
				}
			}
		}
	}
	p.CPUSeconds = float64(total) / 1e9
	if p.Seconds > 0 {
		p.CoresBusy = p.CPUSeconds / p.Seconds
	}
	p.Flat, p.Cum = topFuncs(flat, total), topFuncs(cum, total)
	return nil
}

func topFuncs(m map[string]int64, total int64) []ProfileFunc {
	fs := make([]ProfileFunc, 0, len(m))
	for name, v := range m {
		fs = append(fs, ProfileFunc{Name: name, MS: float64(v) / 1e6, Pct: 100 * float64(v) / float64(max(total, 1))})
	}
	slices.SortFunc(fs, func(a, b ProfileFunc) int {
		if a.MS != b.MS {
			if a.MS > b.MS {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	return fs[:min(len(fs), profileTop)]
}

// profile is the part of profile.proto (github.com/google/pprof) a summary
// needs, decoded by hand: the module has no protobuf code for it.
type profile struct {
	sampleTypes []int64 // string index of each value's type
	samples     []sample
	locFuncs    map[uint64][]uint64 // location id -> function ids, innermost first
	funcNames   map[uint64]int64    // function id -> string index of its name
	strings     []string
}

type sample struct {
	locs   []uint64 // leaf first
	values []int64
}

func (p *profile) str(i int64) string {
	if i < 0 || int(i) >= len(p.strings) {
		return "?"
	}
	return p.strings[i]
}

// parseProfile decodes the fields of profile.proto that summarize reads:
// Profile.sample_type (1), sample (2), location (4), function (5) and
// string_table (6); every other field is skipped.
func parseProfile(b []byte) (*profile, error) {
	p := &profile{locFuncs: map[uint64][]uint64{}, funcNames: map[uint64]int64{}}
	err := pbFields(b, func(field int, wire int, v uint64, data []byte) error {
		switch field {
		case 1: // ValueType{type = 1}
			return pbFields(data, func(f, _ int, v uint64, _ []byte) error {
				if f == 1 {
					p.sampleTypes = append(p.sampleTypes, int64(v))
				}
				return nil
			})
		case 2: // Sample{location_id = 1 (packed), value = 2 (packed)}
			var s sample
			err := pbFields(data, func(f, w int, v uint64, d []byte) error {
				switch {
				case f == 1 && w == 0:
					s.locs = append(s.locs, v)
				case f == 1 && w == 2:
					return pbVarints(d, func(x uint64) { s.locs = append(s.locs, x) })
				case f == 2 && w == 0:
					s.values = append(s.values, int64(v))
				case f == 2 && w == 2:
					return pbVarints(d, func(x uint64) { s.values = append(s.values, int64(x)) })
				}
				return nil
			})
			p.samples = append(p.samples, s)
			return err
		case 4: // Location{id = 1, line = 4: Line{function_id = 1}}
			var id uint64
			var fns []uint64
			err := pbFields(data, func(f, _ int, v uint64, d []byte) error {
				switch f {
				case 1:
					id = v
				case 4:
					return pbFields(d, func(lf, _ int, lv uint64, _ []byte) error {
						if lf == 1 {
							fns = append(fns, lv)
						}
						return nil
					})
				}
				return nil
			})
			p.locFuncs[id] = fns
			return err
		case 5: // Function{id = 1, name = 2}
			var id uint64
			var name int64
			err := pbFields(data, func(f, _ int, v uint64, _ []byte) error {
				switch f {
				case 1:
					id = v
				case 2:
					name = int64(v)
				}
				return nil
			})
			p.funcNames[id] = name
			return err
		case 6:
			p.strings = append(p.strings, string(data))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("bench: profile: %w", err)
	}
	return p, nil
}

var errProto = errors.New("malformed protobuf")

// pbFields calls fn for each field of the protobuf message b: its number,
// wire type, value (varint and fixed types) and data (length-delimited).
func pbFields(b []byte, fn func(field, wire int, v uint64, data []byte) error) error {
	for len(b) > 0 {
		key, n := pbVarint(b)
		if n == 0 {
			return errProto
		}
		b = b[n:]
		field, wire := int(key>>3), int(key&7)
		var v uint64
		var data []byte
		switch wire {
		case 0:
			if v, n = pbVarint(b); n == 0 {
				return errProto
			}
			b = b[n:]
		case 1:
			if len(b) < 8 {
				return errProto
			}
			b = b[8:]
		case 2:
			l, n := pbVarint(b)
			if n == 0 || uint64(len(b)-n) < l {
				return errProto
			}
			data, b = b[n:n+int(l)], b[n+int(l):]
		case 5:
			if len(b) < 4 {
				return errProto
			}
			b = b[4:]
		default:
			return errProto
		}
		if err := fn(field, wire, v, data); err != nil {
			return err
		}
	}
	return nil
}

// pbVarints calls fn for each varint of a packed field.
func pbVarints(b []byte, fn func(uint64)) error {
	for len(b) > 0 {
		v, n := pbVarint(b)
		if n == 0 {
			return errProto
		}
		fn(v)
		b = b[n:]
	}
	return nil
}

// pbVarint decodes a varint; n is 0 when b holds none.
func pbVarint(b []byte) (v uint64, n int) {
	for i := 0; i < len(b) && i < 10; i++ {
		v |= uint64(b[i]&0x7f) << (7 * i)
		if b[i] < 0x80 {
			return v, i + 1
		}
	}
	return 0, 0
}
