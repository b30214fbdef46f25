package bench

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// spun keeps spin's sums, so that the compiler keeps its work.
var spun atomic.Int64

// spin burns CPU for d, in a function the profile must name.
//
//go:noinline
func spin(d time.Duration) {
	n := 0
	for end := time.Now().Add(d); time.Now().Before(end); {
		for i := range 10000 {
			n += i * i
		}
	}
	spun.Add(int64(n))
}

// A CPU profile of this process, as runtime/pprof writes it, summarizes to
// its CPU time with the busy function on top of the cumulative list.
func TestSummarizeProfile(t *testing.T) {
	var buf bytes.Buffer
	if err := pprof.StartCPUProfile(&buf); err != nil {
		t.Fatal(err)
	}
	spin(400 * time.Millisecond)
	pprof.StopCPUProfile()
	p := CPUProfile{Seconds: 0.4}
	if err := p.summarize(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	if p.CPUSeconds <= 0 || p.CPUSeconds > 2 || len(p.Flat) == 0 || len(p.Cum) == 0 {
		t.Fatalf("summary %+v", p)
	}
	found := false
	for _, f := range p.Cum {
		if strings.HasSuffix(f.Name, "bench.spin") {
			found = f.Pct > 50
		}
	}
	if !found {
		t.Errorf("bench.spin is not over half of the cumulative CPU: %+v", p.Cum)
	}
	if p.Flat[0].Pct < p.Flat[len(p.Flat)-1].Pct || p.Flat[0].Pct > 100 {
		t.Errorf("flat list not in order: %+v", p.Flat)
	}
	p.perRequest(1000) // 1000 requests/s over 0.4 s: 400 requests
	if want := p.CPUSeconds * 1e6 / 400; p.CPUMicrosPerRequest != want {
		t.Errorf("CPU per request %v, want %v", p.CPUMicrosPerRequest, want)
	}
	if err := (&CPUProfile{}).summarize([]byte("not a profile\xff")); err == nil {
		t.Error("garbage summarized without an error")
	}
}

// servePprof serves a stand-in for net/http/pprof's CPU profile: it profiles
// this process while spinning for 300 ms, and wants seconds=1.
func servePprof(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/profile", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("seconds") != "1" {
			http.Error(w, "seconds "+r.URL.Query().Get("seconds"), http.StatusBadRequest)
			return
		}
		_ = pprof.StartCPUProfile(w)
		spin(300 * time.Millisecond)
		pprof.StopCPUProfile()
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// profileDuring fetches the profile from a pprof address and reports its
// errors in the summary.
func TestProfileDuring(t *testing.T) {
	p := <-profileDuring(context.Background(), servePprof(t), 2*time.Second)
	if p.Error != "" || p.Seconds != 1 || p.CPUSeconds <= 0 {
		t.Fatalf("profile %+v", p)
	}
	p = <-profileDuring(context.Background(), "127.0.0.1:1", 2*time.Second)
	if p.Error == "" {
		t.Error("a closed port gave no error")
	}
}

// A run with RouterPprof reports the router's profile with its CPU per
// request; a direct run, which bypasses the router, does not profile it.
func TestRunProfilesRouter(t *testing.T) {
	shortSettle(t)
	f := newFakeRouter()
	cfg := fakeConfig(f.serve(t), f)
	cfg.Duration = 1500 * time.Millisecond
	cfg.RouterPprof = servePprof(t)
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := rep.RouterProfile
	if p == nil || p.Error != "" || p.CPUSeconds <= 0 || p.CPUMicrosPerRequest <= 0 || rep.requestsPerSec() <= 0 {
		t.Fatalf("router profile %+v (requests/s %v)", p, rep.requestsPerSec())
	}
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil || !strings.Contains(text.String(), "µs of CPU per request") {
		t.Errorf("text report lacks the router's CPU (%v):\n%s", err, text.String())
	}
	cfg.Direct, cfg.RunID = true, "t2"
	if rep, err = Run(context.Background(), cfg); err != nil || rep.RouterProfile != nil {
		t.Errorf("direct run: profile %+v, err %v", rep.RouterProfile, err)
	}
}
