// Package layering states redcell's package layering as rules over the import
// graph and checks them (TestLayering runs them on the tree, and on made-up
// graphs that break each rule). The rules are those of docs/architecture.md,
// "Package dependencies":
//
//   - storage never depends on cell, router or cmd;
//   - sharding never depends on storage;
//   - model depends on nothing of redcell but internal/invariant;
//   - router never depends on cell or storage;
//   - internal never depends on api or cell;
//   - no package under cell/ depends on cell itself;
//   - only sim (and tests) import storage/memstore;
//   - nothing imports cmd.
//
// "Depends on" is transitive: a package breaks a rule through any chain of
// imports, and the violation names the chain. Only the imports of non-test
// files count: a test may bind what its package may not.
//
// One rule is over the source rather than the imports: the non-test code of
// cell and storage reads time only through internal/clock (TimeReads;
// TestTimeThroughClock runs it on the tree).
package layering

import (
	"bufio"
	"fmt"
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Graph maps an import path of the module to the module's packages it imports
// directly (non-test files; standard library and other modules left out).
type Graph map[string][]string

// Rule is one layering rule: packages From matches may not depend on packages
// Banned matches, directly or through others (Direct: only directly).
type Rule struct {
	Name   string
	From   func(pkg string) bool
	Banned func(pkg string) bool
	Direct bool
}

// Violation is one package breaking one rule; Chain is the import chain from
// the package to the banned one, both included.
type Violation struct {
	Rule  string
	Chain []string
}

func (v Violation) String() string {
	return fmt.Sprintf("%s: %s", v.Rule, strings.Join(v.Chain, " -> "))
}

// Rules returns the layering rules of module mod (its path in go.mod).
func Rules(mod string) []Rule {
	under := func(dirs ...string) func(string) bool {
		return func(pkg string) bool {
			for _, d := range dirs {
				p := mod + "/" + d
				if pkg == p || strings.HasPrefix(pkg, p+"/") {
					return true
				}
			}
			return false
		}
	}
	is := func(names ...string) func(string) bool {
		return func(pkg string) bool {
			for _, n := range names {
				if pkg == mod+"/"+n {
					return true
				}
			}
			return false
		}
	}
	anything := func(string) bool { return true }
	ofModule := func(pkg string) bool { return strings.HasPrefix(pkg, mod+"/") }
	return []Rule{
		{Name: "storage-below-cell", From: under("storage"), Banned: under("cell", "router", "cmd")},
		{Name: "sharding-below-storage", From: under("sharding"), Banned: under("storage")},
		{Name: "model-pure", From: under("model"),
			Banned: func(p string) bool { return ofModule(p) && !under("model", "internal/invariant")(p) }},
		{Name: "router-apart-from-cells", From: under("router"), Banned: under("cell", "storage")},
		{Name: "internal-below-api", From: under("internal"), Banned: under("api", "cell")},
		{Name: "cell-parts-below-cell", From: func(p string) bool { return under("cell")(p) && !is("cell")(p) }, Banned: is("cell")},
		{Name: "memstore-only-in-sim", From: func(p string) bool { return !under("sim", "storage/memstore")(p) },
			Banned: under("storage/memstore"), Direct: true},
		{Name: "nothing-imports-cmd", From: anything, Banned: under("cmd"), Direct: true},
	}
}

// Check returns every violation of rules in g, sorted; for a transitive rule,
// one per offending package and banned package, through the shortest chain.
func Check(g Graph, rules []Rule) []Violation {
	var out []Violation
	pkgs := make([]string, 0, len(g))
	for p := range g {
		pkgs = append(pkgs, p)
	}
	slices.Sort(pkgs)
	for _, r := range rules {
		for _, p := range pkgs {
			if !r.From(p) {
				continue
			}
			for _, chain := range reach(g, p, r.Direct) {
				if r.Banned(chain[len(chain)-1]) {
					out = append(out, Violation{Rule: r.Name, Chain: chain})
				}
			}
		}
	}
	return out
}

// reach returns, for each package p depends on (only its direct imports when
// direct), the shortest import chain from p to it, in breadth-first order.
func reach(g Graph, p string, direct bool) [][]string {
	var out [][]string
	prev := map[string]string{p: ""}
	queue := []string{p}
	for len(queue) > 0 {
		q := queue[0]
		queue = queue[1:]
		if direct && q != p {
			continue
		}
		imps := slices.Clone(g[q])
		slices.Sort(imps)
		for _, imp := range imps {
			if _, seen := prev[imp]; seen {
				continue
			}
			prev[imp] = q
			queue = append(queue, imp)
			chain := []string{imp}
			for at := q; at != ""; at = prev[at] {
				chain = append(chain, at)
			}
			slices.Reverse(chain)
			out = append(out, chain)
		}
	}
	return out
}

// Load reads the import graph of the module rooted at root (the folder of its
// go.mod) from the source of its packages; it returns the graph and the
// module path. Folders named testdata or starting with "." or "_", and any
// holding a go.mod of their own, are skipped, as the go command skips them.
func Load(root string) (Graph, string, error) {
	mod, err := modulePath(filepath.Join(root, "go.mod"))
	if err != nil {
		return nil, "", err
	}
	g := Graph{}
	err = filepath.WalkDir(root, func(dir string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		name := d.Name()
		if dir != root {
			if name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				return filepath.SkipDir
			}
		}
		bp, err := build.ImportDir(dir, 0)
		if err != nil {
			if _, none := err.(*build.NoGoError); none {
				return nil
			}
			return fmt.Errorf("layering: %s: %w", dir, err)
		}
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			return err
		}
		pkg := mod
		if rel != "." {
			pkg = mod + "/" + filepath.ToSlash(rel)
		}
		var imps []string
		for _, imp := range bp.Imports {
			if imp == mod || strings.HasPrefix(imp, mod+"/") {
				imps = append(imps, imp)
			}
		}
		g[pkg] = imps
		return nil
	})
	return g, mod, err
}

// modulePath reads the module line of a go.mod file.
func modulePath(gomod string) (string, error) {
	f, err := os.Open(gomod)
	if err != nil {
		return "", fmt.Errorf("layering: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("layering: %s: %w", gomod, err)
	}
	return "", fmt.Errorf("layering: %s has no module line", gomod)
}
