package couponbatch

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var now = time.Date(2027, 1, 31, 20, 0, 0, 0, time.FixedZone("CST", 8*3600))

func TestDemoFile(t *testing.T) {
	c, err := Load("../../deploy/local/coupons.yaml", now)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Open("demo-batch", now)
	if err != nil {
		t.Fatal(err)
	}
	if b.Stock != 1_000_000 || b.FaceValue != 500 || b.PerPersonLimit != 1 || b.Group != "demo-group" {
		t.Fatalf("demo-batch: %+v", b)
	}
	if b2, ok := c.Batch("demo-batch-2"); !ok || b2.Group != "demo-group" || b2.FaceValue != 300 {
		t.Fatalf("demo-batch-2: %+v", b2)
	}
	if len(c.Batches()) != 10 || c.Batches()[0].ID != "demo-batch" || c.Batches()[2].ID != "bench-hot-1" {
		t.Fatalf("order: %v", c.Batches())
	}
	// The bench's batches (bench.DefaultCouponsConfig) are in the file.
	for _, id := range []string{"bench-hot-1", "bench-hot-2", "bench-cold-1", "bench-cold-6"} {
		if b, ok := c.Batch(id); !ok || b.Group != "" || b.Stock < 10_000_000 {
			t.Fatalf("%s: %+v %v", id, b, ok)
		}
	}
	if c.Risk != (RiskRules{60, 6000, 60}) {
		t.Fatalf("risk: %+v", c.Risk)
	}
}

func TestParseRefuses(t *testing.T) {
	for name, c := range map[string]struct{ file, want string }{
		"empty":        {``, "the file is empty"},
		"unknown key":  {"batches:\n  - id: a\n    stok: 1\n", "field stok not found"},
		"two docs":     {"batches: [{id: a, stock: 1, face_value: 1, per_person_limit: 1}]\n---\nbatches: []\n", "more than one YAML document"},
		"no batch":     {"batches: []\n", "batches: no batch"},
		"bad id":       {"batches: [{id: a_b, stock: 1, face_value: 1, per_person_limit: 1}]\n", `batches[0].id: "a_b": an ID holds only`},
		"twice":        {"batches: [{id: a, stock: 1, face_value: 1, per_person_limit: 1}, {id: a, stock: 1, face_value: 1, per_person_limit: 1}]\n", `batches[1].id: "a" is also batches[0]`},
		"stock":        {"batches: [{id: a, stock: 0, face_value: 1, per_person_limit: 1}]\n", "batches[0].stock: 0: want 1.."},
		"face value":   {"batches: [{id: a, stock: 1, face_value: 0, per_person_limit: 1}]\n", "batches[0].face_value: 0: want 1..10000000 cents"},
		"limit":        {"batches: [{id: a, stock: 1, face_value: 1, per_person_limit: 0}]\n", "batches[0].per_person_limit: 0"},
		"group":        {"batches: [{id: a, stock: 1, face_value: 1, per_person_limit: 1, group: 'x y'}]\n", `batches[0].group: "x y"`},
		"no zone":      {"batches: [{id: a, stock: 1, face_value: 1, per_person_limit: 1, start: '2027-01-31T20:00:00'}]\n", "batches[0].start: \"2027-01-31T20:00:00\" is no RFC 3339 time"},
		"end first":    {"batches: [{id: a, stock: 1, face_value: 1, per_person_limit: 1, start: '2027-02-01T00:00:00+08:00', end: '2027-01-31T00:00:00+08:00'}]\n", "batches[0]: end 2027-01-31T00:00:00+08:00 is not after start"},
		"risk":         {"batches: [{id: a, stock: 1, face_value: 1, per_person_limit: 1}]\nrisk: {per_ip_per_min: -1}\n", "risk.per_ip_per_min: -1"},
		"yuan":         {"batches: [{id: a, stock: 1, face_value: 4.99, per_person_limit: 1}]\n", `face_value: "4.99" is not an integer`},
		"float limit":  {"batches: [{id: a, stock: 1, face_value: 1, per_person_limit: 1.9}]\n", `per_person_limit: "1.9" is not an integer`},
		"string stock": {"batches: [{id: a, stock: '5', face_value: 1, per_person_limit: 1}]\n", "cannot unmarshal !!str `5` into int64"},
		"float risk":   {"batches: [{id: a, stock: 1, face_value: 1, per_person_limit: 1}]\nrisk: {per_act_per_min: 2.5}\n", `per_act_per_min: "2.5" is not an integer`},
		"two problems": {"batches: [{id: a, stock: 0, face_value: 0, per_person_limit: 1}]\n", "stock: 0: want 1..1000000000000 coupons; batches[0].face_value"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(c.file), now)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Parse: %v, want it to say %q", err, c.want)
			}
		})
	}
}

func TestOpenWindow(t *testing.T) {
	c, err := Parse([]byte("batches: [{id: a, stock: 5, face_value: 100, per_person_limit: 2, start: '2027-01-31T20:00:00+08:00', end: '2027-01-31T21:00:00+08:00'}]\n"), now)
	if err != nil {
		t.Fatal(err)
	}
	for at, want := range map[time.Time]error{
		now.Add(-time.Nanosecond):            ErrNotStarted,
		now:                                  nil,
		now.Add(time.Hour - time.Nanosecond): nil,
		now.Add(time.Hour):                   ErrEnded,
	} {
		if _, err := c.Open("a", at); !errors.Is(err, want) {
			t.Errorf("Open at %s: %v, want %v", at, err, want)
		}
	}
	if _, err := c.Open("b", now); !errors.Is(err, ErrUnknownBatch) {
		t.Errorf("unknown batch: %v", err)
	}
	if c.Risk != (RiskRules{DefaultPerDevicePerMin, DefaultPerIPPerMin, DefaultPerActPerMin}) {
		t.Errorf("default risk caps: %+v", c.Risk)
	}
}

func TestReloadChecksIssued(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "coupons.yaml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var h Holder
	if h.Catalog() != nil {
		t.Fatal("a zero Holder holds a catalog")
	}
	write("batches: [{id: a, stock: 10, face_value: 100, per_person_limit: 1}, {id: b, stock: 10, face_value: 100, per_person_limit: 1}]\n")
	issued := map[string]int64{"a": 7, "b": 3}
	first, err := h.Reload(path, now, func(id string) int64 { return issued[id] })
	if err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{
		"batches: [{id: a, stock: 6, face_value: 100, per_person_limit: 1}, {id: b, stock: 10, face_value: 100, per_person_limit: 1}]\n": "batch a: stock 6 is below the 7 coupons issued already",
		"batches: [{id: a, stock: 10, face_value: 100, per_person_limit: 1}]\n":                                                          "batch b: dropped, but it has issued 3 coupons",
		"batches: [{id: a, stock: 0, face_value: 100, per_person_limit: 1}]\n":                                                           "batches[0].stock: 0",
	} {
		write(file)
		if _, err := h.Reload(path, now, func(id string) int64 { return issued[id] }); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("reload of %s: %v, want %q", file, err, want)
		}
		if h.Catalog() != first {
			t.Fatal("a refused reload changed the catalog")
		}
	}
	write("batches: [{id: a, stock: 7, face_value: 100, per_person_limit: 1}, {id: b, stock: 3, face_value: 100, per_person_limit: 1}, {id: c, stock: 1, face_value: 1, per_person_limit: 1}]\n")
	next, err := h.Reload(path, now, func(id string) int64 { return issued[id] })
	if _, ok := next.Batch("c"); err != nil || h.Catalog() != next || !ok || next.Version == first.Version {
		t.Fatalf("reload down to what was issued: %v", err)
	}
	// Once issued, a batch keeps its group and its limit never falls.
	write("batches: [{id: a, stock: 7, face_value: 100, per_person_limit: 2, group: g}, {id: b, stock: 3, face_value: 100, per_person_limit: 1}, {id: c, stock: 1, face_value: 1, per_person_limit: 1}]\n")
	if _, err := h.Reload(path, now, func(id string) int64 { return issued[id] }); err == nil || !strings.Contains(err.Error(), `batch a: group "" -> "g" after 7 coupons`) {
		t.Fatalf("a group change after issuing: %v", err)
	}
	write("batches: [{id: a, stock: 7, face_value: 100, per_person_limit: 3}, {id: b, stock: 3, face_value: 100, per_person_limit: 1}, {id: c, stock: 1, face_value: 1, per_person_limit: 1, group: g}]\n")
	raised, err := h.Reload(path, now, func(id string) int64 { return issued[id] })
	if err != nil {
		t.Fatalf("a raised limit, and a group on a batch that issued nothing: %v", err)
	}
	write("batches: [{id: a, stock: 7, face_value: 100, per_person_limit: 2}, {id: b, stock: 3, face_value: 100, per_person_limit: 1}, {id: c, stock: 1, face_value: 1, per_person_limit: 1, group: g}]\n")
	if _, err := h.Reload(path, now, func(id string) int64 { return issued[id] }); err == nil || !strings.Contains(err.Error(), "batch a: per_person_limit 3 -> 2 after 7 coupons were issued") || h.Catalog() != raised {
		t.Fatalf("a lowered limit after issuing: %v", err)
	}
}
