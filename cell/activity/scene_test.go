package activity

import (
	"fmt"
	"strings"
	"testing"
)

// sceneFile is a one-scene file whose scene ends in extra (", key: value"
// pairs of the flow map).
func sceneFile(extra string) []byte {
	return fmt.Appendf(nil, `
activities:
  - id: fest
    children:
      - id: fest-off
        stage: official
        rewards: [{id: r, scenes: [{id: rain, award_type: cash, amount: {min: 1, max: 10}, budget: 1000, rate_limit: {per_sec: 1, burst: 1}, pay_into: wallet%s}]}]
`, extra)
}

// A scene's compensate is no longer read: a file that has it (true or
// false) still loads, with a warning naming its place; a file without it
// loads without one.
func TestCompensateWarns(t *testing.T) {
	for _, v := range []string{"true", "false"} {
		tr, err := Parse(sceneFile(", compensate: "+v), now)
		if err != nil {
			t.Fatalf("compensate: %s: %v, want it loaded", v, err)
		}
		if len(tr.Warnings) != 1 || !strings.HasPrefix(tr.Warnings[0], "activities[0].children[0].rewards[0].scenes[0].compensate: no longer read") {
			t.Errorf("compensate: %s: warnings %q", v, tr.Warnings)
		}
	}
	tr, err := Parse(sceneFile(""), now)
	if err != nil || len(tr.Warnings) != 0 {
		t.Fatalf("without compensate: %v, warnings %q", err, tr.Warnings)
	}
	ref, err := Load("../../deploy/local/activities.yaml", now)
	if err != nil || len(ref.Warnings) != 0 {
		t.Fatalf("the reference file: %v, warnings %q; it must not teach a key that does nothing", err, ref.Warnings)
	}
}

// reserve_percent: absent is 10 %; 0..99 is taken; anything else, or one
// on a scene that controls no stock, is a problem with its place.
func TestReservePercent(t *testing.T) {
	for _, c := range []struct {
		extra string
		want  int64 // the reserve of the budget of 1,000
	}{
		{", control_stock: true", 100},
		{", control_stock: true, reserve_percent: 0", 0},
		{", control_stock: true, reserve_percent: 25", 250},
		{", control_stock: true, reserve_percent: 99", 990},
		{"", 100}, // no control_stock: Reserve is never asked, but answers the default
	} {
		tr, err := Parse(sceneFile(c.extra), now)
		if err != nil {
			t.Fatalf("%q: %v", c.extra, err)
		}
		sc := tr.SceneByKey("fest/fest-off/rain")
		if got := sc.Reserve(sc.Total()); got != c.want {
			t.Errorf("%q: reserve %d, want %d", c.extra, got, c.want)
		}
	}
	for _, c := range []struct{ extra, problem string }{
		{", control_stock: true, reserve_percent: 100", "scenes[0].reserve_percent: must be 0..99, got 100"},
		{", control_stock: true, reserve_percent: -1", "scenes[0].reserve_percent: must be 0..99, got -1"},
		{", reserve_percent: 10", "scenes[0].reserve_percent: only a scene with control_stock: true"},
		{", control_stock: true, reserve_percent: ten", "cannot unmarshal"},
	} {
		if _, err := Parse(sceneFile(c.extra), now); err == nil || !strings.Contains(err.Error(), c.problem) {
			t.Errorf("%q: %v, want %q", c.extra, err, c.problem)
		}
	}
	// A rate the shared bucket cannot hold.
	for _, c := range []struct{ rate, problem string }{
		{"{per_sec: 1000001, burst: 1}", "per_sec at most 1000000"},
		{"{per_sec: 1, burst: 86401}", "burst 86401 is more than 86400 s of per_sec 1"},
		{"{per_sec: 0, burst: 1}", "per_sec and burst must be >= 1"},
	} {
		f := strings.Replace(string(sceneFile("")), "{per_sec: 1, burst: 1}", c.rate, 1)
		if _, err := Parse([]byte(f), now); err == nil || !strings.Contains(err.Error(), c.problem) {
			t.Errorf("%q: %v, want %q", c.rate, err, c.problem)
		}
	}
	// Rounded down, and no overflow near the top of int64.
	p := 33
	sc := Scene{AwardType: AwardCash, ReservePercent: &p}
	if got := sc.Reserve(1_000_003); got != 330_000 {
		t.Errorf("33 %% of 1,000,003: %d, want 330,000", got)
	}
	if got, want := sc.Reserve(1<<62), int64(1<<62)/100*33+int64(1<<62)%100*33/100; got != want || got <= 0 {
		t.Errorf("33 %% of 2^62: %d, want %d", got, want)
	}
}
