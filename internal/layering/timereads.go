package layering

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// SystemClock names the functions of package time that read the system
// clock or wait on it. Production code in cell and storage calls none of
// them: it reads time through the internal/clock Clock it is given, so
// tests and the simulation run it on a clock they drive. What only
// computes with times (time.Duration arithmetic, time.Unix, time.UnixMilli,
// time.Date, Time's methods) is not here.
var SystemClock = []string{"Now", "Since", "Until", "After", "AfterFunc", "Sleep", "Tick", "NewTicker", "NewTimer"}

// TimeReads returns every use of a SystemClock function in the non-test Go
// files under the folders dirs of root (relative to it, slash-separated),
// as "path:line: time.Name" with the path relative to root, in file and
// line order. Folders named testdata or starting with "." or "_" are
// skipped, as the go command skips them, and so are the folders skip names
// (relative to root, with what is under them). Every file is read, whatever
// its build constraints.
func TimeReads(root string, dirs, skip []string) ([]string, error) {
	var out []string
	for _, dir := range dirs {
		err := filepath.WalkDir(filepath.Join(root, filepath.FromSlash(dir)), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			rel = filepath.ToSlash(rel)
			if d.IsDir() {
				name := d.Name()
				if name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || slices.Contains(skip, rel) {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
				return nil
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			found, err := TimeReadsIn(rel, src)
			out = append(out, found...)
			return err
		})
		if err != nil {
			return out, fmt.Errorf("layering: %w", err)
		}
	}
	return out, nil
}

// TimeReadsIn returns every use of a SystemClock function in the Go source
// src of the file named name, as "name:line: time.Name", in line order: a
// call or a function value (now := time.Now), through whatever name the
// file imports time as. A dot import of time is reported as one use, at
// the import: its uses could not be told apart from the file's own names.
// The file is only parsed, not type-checked: a variable it names like the
// import (time) shadowing the package would be taken for it; name it
// otherwise.
func TimeReadsIn(name string, src []byte) ([]string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var local []string // the names time is imported as
	var out []string
	at := func(p token.Pos, what string) {
		out = append(out, fmt.Sprintf("%s:%d: %s", name, fset.Position(p).Line, what))
	}
	for _, imp := range f.Imports {
		if path, _ := strconv.Unquote(imp.Path.Value); path != "time" {
			continue
		}
		switch {
		case imp.Name == nil:
			local = append(local, "time")
		case imp.Name.Name == ".":
			at(imp.Pos(), `import . "time"`)
		case imp.Name.Name != "_":
			local = append(local, imp.Name.Name)
		}
	}
	if len(local) == 0 {
		return out, nil
	}
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		x, ok := sel.X.(*ast.Ident)
		if ok && slices.Contains(local, x.Name) && slices.Contains(SystemClock, sel.Sel.Name) {
			at(sel.Pos(), "time."+sel.Sel.Name)
		}
		return true
	})
	return out, nil
}
