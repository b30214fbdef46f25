package layering

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// depsHeading is the section of docs/architecture.md whose first fenced
// block lists the module's packages and the module's packages each imports
// directly (non-test files), one "pkg -> a, b" entry per package (module
// path left out; "none" for no imports; a line starting with spaces
// continues the entry above).
const depsHeading = "## Package dependencies"

// TestDocDependencies holds docs/architecture.md's dependency list to the
// import graph: each entry's imports are the package's own, no entry names
// a package that is not there, and every package that imports one of the
// module's is listed. On a failure it prints the list as it should read.
func TestDocDependencies(t *testing.T) {
	root, g, mod := loadModule(t)
	raw, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := docDeps(string(raw))
	if err != nil {
		t.Fatal(err)
	}
	want := Graph{}
	for pkg, imps := range g {
		short := func(p string) string { return strings.TrimPrefix(strings.TrimPrefix(p, mod), "/") }
		var deps []string
		for _, imp := range imps {
			deps = append(deps, short(imp))
		}
		sort.Strings(deps)
		want[short(pkg)] = slices.Compact(deps)
	}
	bad := false
	for pkg, deps := range doc {
		have, ok := want[pkg]
		switch {
		case !ok:
			t.Errorf("docs lists %s, which is not a package of the module", pkg)
			bad = true
		case !slices.Equal(deps, have):
			t.Errorf("docs: %s -> %v; it imports %v", pkg, deps, have)
			bad = true
		}
	}
	for pkg, deps := range want {
		if _, ok := doc[pkg]; !ok && len(deps) > 0 {
			t.Errorf("docs does not list %s (it imports %v)", pkg, deps)
			bad = true
		}
	}
	if bad {
		t.Logf("the list as it should read:\n%s", formatDeps(want))
	}
}

// docDeps reads the dependency list of the section depsHeading of an
// architecture.md; each entry's imports come back sorted.
func docDeps(md string) (Graph, error) {
	_, sec, ok := strings.Cut(md, "\n"+depsHeading+"\n")
	if !ok {
		return nil, fmt.Errorf("architecture.md: no section %q", depsHeading)
	}
	_, block, ok := strings.Cut(sec, "```\n")
	if !ok {
		return nil, fmt.Errorf("architecture.md: no fenced block in %q", depsHeading)
	}
	block, _, _ = strings.Cut(block, "```")
	var entries []string
	for _, line := range strings.Split(strings.TrimRight(block, "\n"), "\n") {
		if strings.HasPrefix(line, " ") && len(entries) > 0 {
			entries[len(entries)-1] += " " + strings.TrimSpace(line)
			continue
		}
		entries = append(entries, line)
	}
	g := Graph{}
	for _, e := range entries {
		pkg, list, ok := strings.Cut(e, " -> ")
		if !ok {
			return nil, fmt.Errorf("architecture.md: entry %q has no ' -> '", e)
		}
		var deps []string
		if list = strings.TrimSpace(list); list != "none" {
			for _, d := range strings.Split(list, ",") {
				deps = append(deps, strings.TrimSpace(d))
			}
		}
		sort.Strings(deps)
		g[strings.TrimSpace(pkg)] = deps
	}
	return g, nil
}

// formatDeps writes g as docDeps reads it: packages sorted, entries wrapped
// before 100 columns.
func formatDeps(g Graph) string {
	var pkgs []string
	for p, deps := range g {
		if len(deps) > 0 {
			pkgs = append(pkgs, p)
		}
	}
	sort.Strings(pkgs)
	var b strings.Builder
	for _, p := range pkgs {
		line := p + " ->"
		for i, d := range g[p] {
			sep := " "
			if i > 0 {
				line += ","
			}
			if len(line)+len(d)+2 > 100 {
				b.WriteString(line + "\n")
				line, sep = "   ", " "
			}
			line += sep + d
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}
