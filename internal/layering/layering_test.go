package layering

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// loadModule loads the import graph of redcell itself (two folders up) and
// returns the module's root folder, the graph and the module path.
func loadModule(t *testing.T) (root string, g Graph, mod string) {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	g, mod, err = Load(root)
	if err != nil {
		t.Fatal(err)
	}
	if mod != "redcell" {
		t.Fatalf("module %q, want redcell", mod)
	}
	return root, g, mod
}

// TestLayering checks the rules on redcell's own packages.
func TestLayering(t *testing.T) {
	_, g, mod := loadModule(t)
	// The graph must be the real one: a few packages and edges known to exist.
	for pkg, imp := range map[string]string{
		"redcell/cell":            "redcell/storage",
		"redcell/storage":         "redcell/model",
		"redcell/router":          "redcell/api",
		"redcell/cmd/redcell":     "redcell/cell",
		"redcell/model":           "redcell/internal/invariant",
		"redcell/api/httpmetrics": "redcell/api",
	} {
		if !slices.Contains(g[pkg], imp) {
			t.Fatalf("loaded graph: %s does not import %s (imports %v)", pkg, imp, g[pkg])
		}
	}
	if len(g) < 40 {
		t.Fatalf("loaded graph has %d packages, want the whole module", len(g))
	}
	for _, v := range Check(g, Rules(mod)) {
		t.Errorf("layering broken: %s", v)
	}
}

// TestRulesCatchEachBreak checks every rule against a made-up graph that
// keeps the layering, then against one break of each rule, directly and
// through a package in between: each break is reported by its rule alone,
// with its import chain.
func TestRulesCatchEachBreak(t *testing.T) {
	const mod = "m"
	good := Graph{
		"m/cmd/redcell":        {"m/cell", "m/router", "m/storage", "m/sharding"},
		"m/cell":               {"m/cell/relay", "m/storage", "m/api", "m/api/httpmetrics", "m/model"},
		"m/cell/relay":         {"m/api", "m/internal/clock", "m/model"},
		"m/router":             {"m/api", "m/api/cellclient", "m/sharding", "m/internal/retry"},
		"m/api":                {"m/model"},
		"m/api/cellclient":     {"m/api", "m/internal/clock"},
		"m/api/httpmetrics":    {"m/api"},
		"m/storage":            {"m/model", "m/sharding", "m/internal/retry"},
		"m/storage/memstore":   {"m/storage", "m/model"},
		"m/sharding":           {"m/model"},
		"m/model":              {"m/internal/invariant"},
		"m/internal/retry":     {"m/internal/clock"},
		"m/internal/clock":     nil,
		"m/internal/invariant": nil,
		"m/sim":                {"m/cell/relay", "m/storage/memstore", "m/storage"},
	}
	if v := Check(good, Rules(mod)); len(v) != 0 {
		t.Fatalf("a graph keeping the layering: %v", v)
	}
	breaks := []struct {
		rule     string
		from, to string // the edge added
		chain    string // the chain reported
	}{
		{"storage-below-cell", "m/storage", "m/cell", "m/storage -> m/cell"},
		{"storage-below-cell", "m/storage/memstore", "m/router", "m/storage/memstore -> m/router"},
		{"storage-below-cell", "m/storage", "m/cmd/redcell", "m/storage -> m/cmd/redcell"},
		{"sharding-below-storage", "m/sharding", "m/storage", "m/sharding -> m/storage"},
		{"model-pure", "m/model", "m/internal/clock", "m/model -> m/internal/clock"},
		{"router-apart-from-cells", "m/router", "m/cell/relay", "m/router -> m/cell/relay"},
		{"router-apart-from-cells", "m/api/cellclient", "m/storage", "m/router -> m/api/cellclient -> m/storage"},
		{"internal-below-api", "m/internal/retry", "m/api/httpmetrics", "m/internal/retry -> m/api/httpmetrics"},
		{"internal-below-api", "m/internal/clock", "m/cell/relay", "m/internal/clock -> m/cell/relay"},
		{"cell-parts-below-cell", "m/cell/relay", "m/cell", "m/cell/relay -> m/cell"},
		{"memstore-only-in-sim", "m/cell", "m/storage/memstore", "m/cell -> m/storage/memstore"},
		{"nothing-imports-cmd", "m/sim", "m/cmd/redcell", "m/sim -> m/cmd/redcell"},
	}
	for _, b := range breaks {
		g := Graph{}
		for p, imps := range good {
			g[p] = slices.Clone(imps)
		}
		g[b.from] = append(g[b.from], b.to)
		var hits []string
		for _, v := range Check(g, Rules(mod)) {
			if v.Rule != b.rule {
				// One added edge may break more than one rule (storage
				// importing cell also makes cell's parts depend on it
				// through cycles); only the named rule's report is
				// checked, and it must be there.
				continue
			}
			hits = append(hits, strings.Join(v.Chain, " -> "))
		}
		if !slices.Contains(hits, b.chain) {
			t.Errorf("%s -> %s: rule %s reported %v, want the chain %q", b.from, b.to, b.rule, hits, b.chain)
		}
	}
}

// TestRulesAreTransitive: a package that reaches a banned one through others
// is reported with the shortest chain, and a direct-only rule is not.
func TestRulesAreTransitive(t *testing.T) {
	g := Graph{
		"m/storage":          {"m/sharding"},
		"m/sharding":         {"m/x"},
		"m/x":                {"m/cell"},
		"m/cell":             nil,
		"m/cmd/a":            {"m/y"},
		"m/y":                {"m/storage/memstore"},
		"m/storage/memstore": nil,
	}
	var got []string
	for _, v := range Check(g, Rules("m")) {
		got = append(got, v.String())
	}
	want := []string{
		"storage-below-cell: m/storage -> m/sharding -> m/x -> m/cell",
		"memstore-only-in-sim: m/y -> m/storage/memstore",
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("missing %q in %v", w, got)
		}
	}
	for _, v := range got {
		if strings.HasPrefix(v, "memstore-only-in-sim: m/cmd/a") {
			t.Errorf("a direct-only rule followed a chain: %s", v)
		}
	}
}
