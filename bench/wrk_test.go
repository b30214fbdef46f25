package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeWrk writes an executable standing in for wrk: it copies the script it
// is given (-s) to script.lua beside it and prints a summary line of 40,000
// requests in 2 s, 100 of them not 2xx.
func fakeWrk(t *testing.T) (bin, scriptCopy string) {
	dir := t.TempDir()
	bin, scriptCopy = filepath.Join(dir, "wrk"), filepath.Join(dir, "script.lua")
	sh := `#!/bin/sh
while [ $# -gt 0 ]; do
  if [ "$1" = -s ]; then cp "$2" ` + scriptCopy + `; fi
  shift
done
echo 'Running 2s test'
echo '` + wrkMark + `{"requests":40000,"duration_us":2000000,"connect":0,"read":0,"write":0,"status":100,"timeout":0,"p50_us":1500,"p90_us":2500,"p99_us":9000,"p999_us":12000,"max_us":20000}'
`
	if err := os.WriteFile(bin, []byte(sh), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, scriptCopy
}

// The limits with wrk run the client check: bench and wrk in turn on the same
// ordinary requests, and report bench ÷ wrk.
func TestClientCheck(t *testing.T) {
	f, url, _, _ := twoCells(t)
	bin, script := fakeWrk(t)
	lc := shortLimits(url)
	lc.Wrk, lc.APIKey = bin, "key-1"
	rep, err := MeasureLimits(context.Background(), lc)
	if err != nil {
		t.Fatal(err)
	}
	c := rep.Client
	if c == nil || c.Error != "" || len(c.Bench) != clientCheckRounds || len(c.WrkRuns) != clientCheckRounds {
		t.Fatalf("client check %+v", c)
	}
	w := c.WrkRuns[0]
	if w.OK != 39900 || w.PerSec != 19950 || w.Errors["HTTP_NOT_2XX"] != 100 || w.LatencyMS.P99 != 9 {
		t.Errorf("wrk run read as %+v", w)
	}
	var plain int64
	for _, b := range c.Bench {
		if b.PerSec <= 0 || len(b.Errors) != 0 {
			t.Errorf("bench round %+v", b)
		}
		plain += b.Count
	}
	if c.WrkPerSec != 19950 || c.BenchOverWrk != ratio(c.BenchPerSec, 19950) || c.SignedOverWrk != ratio(rep.NoopRouter.PerSec, 19950) {
		t.Errorf("means %v %v, ratios %v %v", c.BenchPerSec, c.WrkPerSec, c.BenchOverWrk, c.SignedOverWrk)
	}
	// The check's own requests are ordinary ones: no stress mark.
	if n := f.noStress.Load(); n != plain {
		t.Errorf("%d requests without the stress mark, want the check's %d", n, plain)
	}
	lua, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"Bearer key-1"`, `"` + lc.RunID + `-c-n`, `wrk.format("POST", "/v1/noop/"`, wrkMark} {
		if !strings.Contains(string(lua), want) {
			t.Errorf("wrk script lacks %q", want)
		}
	}
	if strings.Count(string(lua), lc.RunID+"-c-n") != clientCheckActs {
		t.Errorf("wrk script has %d act_ids, want %d", strings.Count(string(lua), lc.RunID+"-c-n"), clientCheckActs)
	}
	var md strings.Builder
	if err := (Suite{Limits: &rep}).WriteSummary(&md); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "Bench ÷ wrk") {
		t.Errorf("report lacks the check:\n%s", md.String())
	}
}

// FindWrk: off, found on PATH, or skipped with a reason.
func TestFindWrk(t *testing.T) {
	if b, s := FindWrk(""); b != "" || s != "" {
		t.Errorf("off: %q %q", b, s)
	}
	if b, s := FindWrk("/opt/wrk"); b != "/opt/wrk" || s != "" {
		t.Errorf("path: %q %q", b, s)
	}
	bin, _ := fakeWrk(t)
	t.Setenv("PATH", filepath.Dir(bin))
	if b, s := FindWrk("auto"); b != bin || s != "" {
		t.Errorf("auto with wrk on PATH: %q %q", b, s)
	}
	t.Setenv("PATH", t.TempDir())
	if b, s := FindWrk("auto"); b != "" || !strings.Contains(s, "not installed") {
		t.Errorf("auto without wrk: %q %q", b, s)
	}
}
