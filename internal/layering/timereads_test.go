package layering

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestTimeThroughClock holds internal/clock's package doc true: production
// code in cell and storage reads time only through the Clock it is given,
// so no non-test file under cell/ or storage/ uses a SystemClock function.
// storage/storagetest is left out: it is the store contract suite, test
// code in non-test files, whose waits bound a test's own goroutines on real
// time. storage/memstore is in: the simulation runs it, on its clock.
func TestTimeThroughClock(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	found, err := TimeReads(root, []string{"cell", "storage"}, []string{"storage/storagetest"})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		t.Errorf("%s reads the system clock: read time through the component's Clock (internal/clock)", f)
	}
	// The walk reads the real tree: internal/clock's Real reads the system
	// clock, and is found.
	real, err := TimeReads(root, []string{"internal/clock"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(real, func(f string) bool { return filepath.Dir(f) == "internal/clock" }) {
		t.Fatalf("internal/clock's own reads of the system clock not found: %v", real)
	}
}

// TestTimeReadsInCatchEach: in made-up sources, every use of a SystemClock
// function is reported at its line, through a renamed import too, and a
// dot import at the import; computing with times is not.
func TestTimeReadsInCatchEach(t *testing.T) {
	cases := []struct {
		src  string
		want []string
	}{
		{`package p

import "time"

func f(d time.Duration) time.Time {
	t := time.Unix(0, 0).Add(3 * time.Second) // computing: fine
	_ = time.UnixMilli(5).Sub(t) + d
	_ = time.Now()
	now := time.Now // a func value reads it too
	<-time.After(d)
	tk := time.NewTicker(d)
	defer tk.Stop()
	time.Sleep(time.Since(t) + time.Until(t))
	return now()
}
`, []string{"p.go:8: time.Now", "p.go:9: time.Now", "p.go:10: time.After", "p.go:11: time.NewTicker",
			"p.go:13: time.Sleep", "p.go:13: time.Since", "p.go:13: time.Until"}},
		{`package p

import tm "time"

func f() { tm.AfterFunc(tm.Second, func() {}); _ = tm.Tick(1); _ = tm.NewTimer(2) }
`, []string{"p.go:5: time.AfterFunc", "p.go:5: time.Tick", "p.go:5: time.NewTimer"}},
		{`package p

import . "time"

func f() Time { return Now() }
`, []string{`p.go:3: import . "time"`}},
		{`package p

import (
	"time"

	"example.com/clock"
)

func f(c clock.Clock) time.Duration { return c.Now().Sub(time.UnixMilli(0)) }
`, nil},
	}
	for i, c := range cases {
		got, err := TimeReadsIn("p.go", []byte(c.src))
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("case %d: %q, want %q", i, got, c.want)
		}
	}
}

// TestTimeReadsWalk: over a made-up tree, a read is found in a non-test
// file under the folders asked for, with its path from the root; test
// files, testdata, the folders skipped and the folders not asked for are
// not read.
func TestTimeReadsWalk(t *testing.T) {
	root := t.TempDir()
	read := "package p\n\nimport \"time\"\n\nvar t = time.Now()\n"
	for _, path := range []string{"cell/a.go", "cell/a_test.go", "cell/testdata/b.go", "cell/part/c.go",
		"storage/memstore/m.go", "storage/storagetest/s.go", "router/r.go"} {
		full := filepath.Join(root, filepath.FromSlash(path))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(read), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := TimeReads(root, []string{"cell", "storage"}, []string{"storage/storagetest"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"cell/a.go:5: time.Now", "cell/part/c.go:5: time.Now", "storage/memstore/m.go:5: time.Now"}
	if !slices.Equal(got, want) {
		t.Fatalf("%q, want %q", got, want)
	}
}
