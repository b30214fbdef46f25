package activity

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var now = time.Date(2027, 1, 25, 12, 0, 0, 0, time.UTC)

// TestReferenceFile: deploy/local/activities.yaml, which make run loads,
// is valid, and its official child covers any date.
func TestReferenceFile(t *testing.T) {
	tr, err := Load("../../deploy/local/activities.yaml", now)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Version) != 12 || tr.Path == "" || !tr.Loaded.Equal(now) {
		t.Errorf("version %q, path %q, loaded %v", tr.Version, tr.Path, tr.Loaded)
	}
	for _, at := range []time.Time{time.Unix(0, 0), now, now.AddDate(50, 0, 0)} {
		a, err := tr.Resolve("demo-festival", "rain", at)
		if err != nil || a.Child.Stage != StageOfficial || a.Scene.AwardType != AwardCash || a.Scene.Amount != (AmountRule{1, 888}) ||
			a.Scene.Budget != 100_000_000 || a.Reward.ID != "red-packet-rain" {
			t.Errorf("rain at %v: %+v, %v", at, a, err)
		}
	}
	if a, err := tr.Resolve("demo-festival", "card", now); err != nil || a.Scene.AwardType != "coupon" || a.Scene.TemplateID != "spring-10off" {
		t.Errorf("card: %+v, %v", a, err)
	}
}

const stagedFile = `
activities:
  - id: fest
    children:
      - id: fest-test
        stage: test
        start: 2027-01-10T00:00:00Z
        end: 2027-01-20T00:00:00Z
        rewards: [{id: r, scenes: [{id: rain, award_type: cash, amount: {min: 1, max: 10}, budget: 1000, rate_limit: {per_sec: 1, burst: 1}, pay_into: wallet}]}]
      - id: fest-gray
        stage: gray
        start: 2027-01-20T00:00:00Z
        end: 2027-01-31T20:00:00Z
        rewards: [{id: r, scenes: [{id: rain, award_type: cash, amount: {min: 1, max: 20}, budget: 2000, rate_limit: {per_sec: 1, burst: 1}, pay_into: wallet}]}]
      - id: fest-official
        stage: official
        start: 2027-01-31T20:00:00Z
        end: 2027-02-01T02:00:00Z
        rewards: [{id: r, scenes: [{id: rain, award_type: cash, amount: {min: 1, max: 888}, budget: 100000, rate_limit: {per_sec: 1, burst: 1}, pay_into: wallet}]}]
`

// The request's time picks the child, hence the stage; outside every
// window, or between windows, there is none.
func TestResolveByTime(t *testing.T) {
	tr, err := Parse([]byte(stagedFile), now)
	if err != nil {
		t.Fatal(err)
	}
	at := func(s string) time.Time { v, _ := time.Parse(time.RFC3339, s); return v }
	for _, c := range []struct {
		at    string
		stage Stage
		max   int64
	}{
		{"2027-01-10T00:00:00Z", StageTest, 10},
		{"2027-01-19T23:59:59Z", StageTest, 10},
		{"2027-01-20T00:00:00Z", StageGray, 20},
		{"2027-01-31T19:59:59Z", StageGray, 20},
		{"2027-01-31T20:00:00Z", StageOfficial, 888},
		{"2027-02-01T01:59:59Z", StageOfficial, 888},
	} {
		a, err := tr.Resolve("fest", "rain", at(c.at))
		if err != nil || a.Child.Stage != c.stage || a.Scene.Amount.Max != c.max {
			t.Errorf("at %s: %+v, %v; want %s", c.at, a, err, c.stage)
		}
	}
	for _, s := range []string{"2027-01-09T23:59:59Z", "2027-02-01T02:00:00Z"} {
		if _, err := tr.Resolve("fest", "rain", at(s)); !errors.Is(err, ErrNoChild) {
			t.Errorf("at %s: %v, want ErrNoChild", s, err)
		}
	}
	if _, err := tr.Resolve("fest", "snow", at("2027-01-12T00:00:00Z")); !errors.Is(err, ErrUnknownScene) {
		t.Errorf("unknown scene: %v", err)
	}
	if _, err := tr.Resolve("other", "rain", at("2027-01-12T00:00:00Z")); !errors.Is(err, ErrUnknownActivity) {
		t.Errorf("unknown parent: %v", err)
	}
}

// Every rule of Validate, each alone in an otherwise valid file, is refused
// with its place in the tree; several problems are all listed.
func TestValidate(t *testing.T) {
	scene := "{id: rain, award_type: cash, amount: {min: 1, max: 10}, budget: 1000, rate_limit: {per_sec: 1, burst: 1}, pay_into: wallet}"
	file := func(children string) string {
		return "activities:\n  - id: fest\n    children:\n" + children
	}
	child := func(id, stage, window, scenes string) string {
		return "      - {id: " + id + ", stage: " + stage + window + ", rewards: [{id: r, scenes: [" + scenes + "]}]}\n"
	}
	if _, err := Parse([]byte(file(child("c1", "official", "", scene))), now); err != nil {
		t.Fatalf("the base file: %v", err)
	}
	cases := []struct{ name, yaml, want string }{
		{"unknown stage", file(child("c1", "prod", "", scene)), `children[0].stage: unknown stage "prod"`},
		{"underscore in an ID", file(child("c1", "official", "", strings.Replace(scene, "id: rain", "id: red_rain", 1))), `scenes[0].id: "red_rain" may hold only`},
		{"underscore in the award type", file(child("c1", "official", "", strings.Replace(scene, "cash", "cash_x", 1))), `award_type: "cash_x" may hold only`},
		{"overlapping windows", file(child("c1", "test", ", start: 2027-01-10T00:00:00Z, end: 2027-01-20T00:00:00Z", scene) +
			child("c2", "gray", ", start: 2027-01-19T00:00:00Z", scene)), "children[1]: its window [2027-01-19T00:00:00Z, +∞) overlaps that of children[0]"},
		{"two open-ended children", file(child("c1", "test", "", scene) + child("c2", "official", "", scene)), "overlaps that of children[0]"},
		{"end before start", file(child("c1", "test", ", start: 2027-01-20T00:00:00Z, end: 2027-01-10T00:00:00Z", scene)), "end 2027-01-10T00:00:00Z is not after start"},
		{"amount min 0", file(child("c1", "official", "", strings.Replace(scene, "min: 1", "min: 0", 1))), "amount: min 0 and max 10"},
		{"amount max below min", file(child("c1", "official", "", strings.Replace(scene, "max: 10", "max: 0", 1))), "want 1 <= min <= max"},
		{"cash without a budget", file(child("c1", "official", "", strings.Replace(scene, "budget: 1000", "budget: 0", 1))), "needs a budget in cents >= 1"},
		{"amount above the budget", file(child("c1", "official", "", strings.Replace(scene, "budget: 1000", "budget: 5", 1))), "max 10 is above the budget 5"},
		{"coupon without stock", file(child("c1", "official", "", strings.Replace(strings.Replace(scene, "cash", "coupon", 1), "budget: 1000", "template_id: t1", 1))), "a coupon scene needs a stock >= 1"},
		{"coupon without template", file(child("c1", "official", "", strings.Replace(strings.Replace(scene, "cash", "coupon", 1), "budget: 1000", "stock: 9", 1))), "names its coupon template"},
		{"no rate", file(child("c1", "official", "", strings.Replace(scene, "per_sec: 1", "per_sec: 0", 1))), "rate_limit: per_sec and burst must be >= 1"},
		{"unknown account", file(child("c1", "official", "", strings.Replace(scene, "wallet", "bank", 1))), `pay_into: unknown account "bank"`},
		{"scene twice", file(child("c1", "official", "", scene+", "+scene)), `scenes[1].id: "rain" is also`},
		{"child ID twice", file(child("c1", "test", ", end: 2027-01-10T00:00:00Z", scene) + child("c1", "official", ", start: 2027-01-10T00:00:00Z", scene)), `children[1].id: "c1" is also`},
		{"unknown key", file(child("c1", "official", "", strings.Replace(scene, "pay_into", "payinto", 1))), "field payinto not found"},
		{"no activity", "activities: []\n", "activities: no activity"},
		{"a date without a zone", file(child("c1", "test", ", start: 2027-01-10", scene)), `children[0].start: "2027-01-10" is no RFC 3339 time with a zone`},
		{"a time without a zone", file(child("c1", "test", ", end: \"2027-01-10 20:00:00\"", scene)), `children[0].end: "2027-01-10 20:00:00" is no RFC 3339`},
		{"a scene twice in one stage", "activities:\n  - id: a\n    children:\n" + child("a1", "official", "", scene) +
			"  - id: b\n    children:\n" + child("b1", "official", "", scene), `activities[1].children[0].rewards[0].scenes[0].id: "rain" is also activities[0]`},
		{"coupon amount above its stock", file(child("c1", "official", "", strings.Replace(strings.Replace(scene, "cash", "coupon", 1), "budget: 1000", "template_id: t1, stock: 5", 1))), "max 10 is above the stock 5"},
		{"an empty file", "", "the file is empty"},
		{"two documents", file(child("c1", "official", "", scene)) + "---\nactivities: []\n", "more than one YAML document"},
		{"no child", "activities:\n  - id: fest\n    children: []\n", "activities[0]: no child activity"},
	}
	for _, c := range cases {
		_, err := Parse([]byte(c.yaml), now)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v\nwant an error with %q", c.name, err, c.want)
		}
	}
	// Several problems at once: each is listed.
	_, err := Parse([]byte(file(child("c_1", "prod", "", strings.Replace(scene, "wallet", "bank", 1)))), now)
	var ps Problems
	if !errors.As(err, &ps) || len(ps) != 3 {
		t.Errorf("three problems: %v", err)
	}
}

// Windows carry their zone: a child from 20:00 Beijing time starts at 12:00
// UTC. The same scene ID may recur in another stage.
func TestWindowZonesAndStages(t *testing.T) {
	f := strings.NewReplacer("2027-01-31T20:00:00Z", "2027-01-31T20:00:00+08:00", "2027-02-01T02:00:00Z", "2027-02-01T02:00:00+08:00",
		"end: 2027-01-31T20:00:00Z", "end: 2027-01-31T12:00:00Z").Replace(stagedFile)
	tr, err := Parse([]byte(f), now)
	if err != nil {
		t.Fatal(err)
	}
	for at, want := range map[time.Time]Stage{
		time.Date(2027, 1, 31, 11, 59, 59, 0, time.UTC): StageGray,
		time.Date(2027, 1, 31, 12, 0, 0, 0, time.UTC):   StageOfficial,
		time.Date(2027, 1, 31, 17, 59, 59, 0, time.UTC): StageOfficial,
	} {
		if a, err := tr.Resolve("fest", "rain", at); err != nil || a.Child.Stage != want {
			t.Errorf("at %v: %+v, %v; want %s", at, a.Child, err, want)
		}
	}
	if _, err := tr.Resolve("fest", "rain", time.Date(2027, 1, 31, 18, 0, 0, 0, time.UTC)); !errors.Is(err, ErrNoChild) {
		t.Errorf("after the official window: %v", err)
	}
}

// A reload refuses a scene whose budget or stock falls below what it has
// issued already, and keeps the loaded tree.
func TestReloadBelowIssued(t *testing.T) {
	path := filepath.Join(t.TempDir(), "activities.yaml")
	if err := os.WriteFile(path, []byte(stagedFile), 0o644); err != nil {
		t.Fatal(err)
	}
	var h Holder
	first, err := h.Reload(path, now, func(string, string, string) int64 { return 0 })
	if err != nil {
		t.Fatal(err)
	}
	// fest-gray's budget is 2000 cents; 2500 issued already.
	issued := func(p, c, s string) int64 {
		if p == "fest" && c == "fest-gray" && s == "rain" {
			return 2500
		}
		return 0
	}
	if _, err := h.Reload(path, now, issued); err != nil {
		t.Errorf("control_stock is off in the file: the budget is not a cap, so nothing to refuse: %v", err)
	}
	kept := h.Tree()
	if kept == first {
		t.Error("the second reload did not swap the tree")
	}
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(stagedFile, "pay_into: wallet", "pay_into: wallet, control_stock: true")), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = h.Reload(path, now, issued)
	if err == nil || !strings.Contains(err.Error(), "fest/fest-gray/rain: budget 2000 is below the 2500 already issued") {
		t.Errorf("a budget below what was issued: %v", err)
	}
	if h.Tree() != kept {
		t.Error("the refused reload replaced the loaded tree")
	}
}

// A reload swaps the whole tree when the file is valid and keeps the loaded
// one when it is not.
func TestHolderReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "activities.yaml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var h Holder
	if h.Tree() != nil {
		t.Fatal("a zero Holder holds a tree")
	}
	write(stagedFile)
	first, err := h.Reload(path, now, nil)
	if err != nil || h.Tree() != first {
		t.Fatalf("first load: %v", err)
	}
	write(strings.Replace(stagedFile, "stage: gray", "stage: grey", 1))
	if _, err := h.Reload(path, now, nil); err == nil || !strings.Contains(err.Error(), `unknown stage "grey"`) || h.Tree() != first {
		t.Errorf("an invalid file: %v; the tree must stay", err)
	}
	write(strings.Replace(stagedFile, "max: 888", "max: 666", 1))
	second, err := h.Reload(path, now.Add(time.Minute), nil)
	if err != nil || h.Tree() != second || second.Version == first.Version {
		t.Fatalf("second load: %v (versions %s, %s)", err, first.Version, second.Version)
	}
	a, err := second.Resolve("fest", "rain", time.Date(2027, 1, 31, 21, 0, 0, 0, time.UTC))
	if err != nil || a.Scene.Amount.Max != 666 {
		t.Errorf("after the reload: %+v, %v", a.Scene, err)
	}
	os.Remove(path)
	if _, err := h.Reload(path, now, nil); err == nil || h.Tree() != second {
		t.Errorf("a missing file: %v; the tree must stay", err)
	}
}
