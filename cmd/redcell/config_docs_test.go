package main

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"redcell/cell"
	"redcell/cell/degrade"
)

// TestConfigDocs holds docs/config.md to the structs a config file is
// decoded into: every key of the top level, router:, cells: and cell:
// (from their YAML tags, through inlined structs) is in the section's table,
// and every key a table lists is one the file may set.
func TestConfigDocs(t *testing.T) {
	b, err := os.ReadFile("../../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := docSections(string(b))
	top := reflect.TypeFor[fileConfig]()
	sections := map[string][]string{"": nil}
	for i := range top.NumField() {
		f := top.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch name {
		case "", "-":
		case "router", "cell":
			sections[name] = yamlKeys(f.Type, "")
		case "cells":
			sections[name] = yamlKeys(f.Type.Elem(), "")
		default:
			sections[""] = append(sections[""], name)
		}
	}
	if len(sections) != 4 || len(sections["cell"]) < 50 || len(sections["router"]) < 10 || len(sections["cells"]) < 6 {
		t.Fatalf("keys read from the structs: %v", sections)
	}
	for sec, keys := range sections {
		documented := doc[sec]
		if len(documented) == 0 {
			t.Errorf("docs/config.md: no table for section %q", sec)
			continue
		}
		for _, k := range keys {
			if !covered(documented, k) {
				t.Errorf("section %q: key %s is not in docs/config.md", sec, k)
			}
		}
		for _, d := range documented {
			if !slices.ContainsFunc(keys, func(k string) bool { return k == d || strings.HasPrefix(k, d+".") }) {
				t.Errorf("section %q: docs/config.md lists %s, which no config field has", sec, d)
			}
		}
	}
}

// covered reports whether key, or a key it is part of, is documented.
func covered(documented []string, key string) bool {
	for k := key; ; {
		if slices.Contains(documented, k) {
			return true
		}
		i := strings.LastIndex(k, ".")
		if i < 0 {
			return false
		}
		k = k[:i]
	}
}

var unmarshaler = reflect.TypeFor[yaml.Unmarshaler]()

// yamlKeys lists the keys a value of type t takes in a file: its fields'
// YAML names, those of inlined structs in place, those of other structs as
// name.sub, those of a map of structs as name.<key>.sub; a type that decodes
// itself is one key, but degrade.Config's keys are its switches.
func yamlKeys(t reflect.Type, prefix string) []string {
	if t == reflect.TypeFor[degrade.Config]() {
		var out []string
		for _, n := range degrade.Names() {
			out = append(out, prefix+n)
		}
		return out
	}
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft == reflect.TypeFor[degrade.Config]():
			out = append(out, yamlKeys(ft, prefix+name+".")...)
		case opts == "inline":
			out = append(out, yamlKeys(ft, prefix)...)
		case name == "":
			out = append(out, prefix+strings.ToLower(f.Name)) // yaml's own name for an untagged field
		case ft.Kind() == reflect.Struct && !reflect.PointerTo(ft).Implements(unmarshaler) && ft.PkgPath() != "time" &&
			ft != reflect.TypeFor[struct{}]() && hasTags(ft):
			out = append(out, yamlKeys(ft, prefix+name+".")...)
		case ft.Kind() == reflect.Map && ft.Elem().Kind() == reflect.Struct:
			out = append(out, yamlKeys(ft.Elem(), prefix+name+".<>.")...)
		default:
			out = append(out, prefix+name)
		}
	}
	return out
}

// hasTags reports whether struct t has YAML-tagged fields (it is a section
// of keys, not a value such as sharding.Ranges).
func hasTags(t reflect.Type) bool {
	for i := range t.NumField() {
		if t.Field(i).Tag.Get("yaml") != "" {
			return true
		}
	}
	return false
}

var (
	docHeading = regexp.MustCompile("^## (Top level|`(router|cells|cell):`)")
	docKey     = regexp.MustCompile("`([a-z0-9_.<>]+)`")
	docPlace   = regexp.MustCompile(`<[a-z_]+>`)
)

// docSections reads the keys of each section's table in docs/config.md:
// the backquoted names of each row's first column ("" is the top level),
// with <placeholders> written <>.
func docSections(md string) map[string][]string {
	out := map[string][]string{}
	sec, in := "", false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "## ") {
			m := docHeading.FindStringSubmatch(line)
			in = m != nil
			if in {
				sec = m[2]
			}
			continue
		}
		if !in || !strings.HasPrefix(line, "| `") {
			continue
		}
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "| "), " |")
		for _, m := range docKey.FindAllStringSubmatch(first, -1) {
			out[sec] = append(out[sec], docPlace.ReplaceAllString(m[1], "<>"))
		}
	}
	return out
}

// TestCellSectionOverDefaults: the cell section is decoded over
// cell.DefaultConfig: a feature left out keeps every default, a
// withdraw_release given is read whole (what it leaves out is 0), an empty
// degrade switch is on and an empty coupon list keeps its default, as
// before; a 0 given is a 0 (kept where 0 means something, refused where it
// may not be 0).
func TestCellSectionOverDefaults(t *testing.T) {
	t.Setenv("REDCELL_CLUSTER_SECRET", "reference-config-secret-0123")
	def := cell.DefaultConfig()
	c, err := cellFromFile(t, oneCell)
	if err != nil {
		t.Fatal(err)
	}
	if c.PacketConfig != def.PacketConfig || c.CommitConfig != def.CommitConfig || c.GuardConfig != def.GuardConfig ||
		c.RewardConfig != def.RewardConfig || c.CouponConfig != def.CouponConfig || c.ReconConfig != def.ReconConfig ||
		c.ClusterConfig != def.ClusterConfig || c.Degrade != def.Degrade || c.RetentionDays != nil || c.ExportDays != 0 {
		t.Fatalf("an empty cell section changed a default:\n%+v\nwant\n%+v", c, def)
	}
	c, err = cellFromFile(t, oneCell+"cell:\n  withdraw_release: {allow: [a1]}\n  token_ttl: 0s\n  max_greeting: 0\n  coupon_prefetch: 0\n")
	if err != nil {
		t.Fatal(err)
	}
	// withdraw_release is read whole: only a1 may withdraw, not everybody
	// (the default's percent 100 does not survive a mapping without it).
	if c.WithdrawRelease.Percent != 0 || !slices.Equal(c.WithdrawRelease.Allow, []string{"a1"}) {
		t.Errorf("withdraw_release with allow only: %+v, want percent 0 and allow [a1]", c.WithdrawRelease)
	}
	if c.TokenTTL != 0 || c.Limits.MaxGreeting != 0 || c.CouponPrefetch != 0 || c.Limits.MaxAmount != def.Limits.MaxAmount {
		t.Errorf("zeros given: token_ttl %s, max_greeting %d, coupon_prefetch %d, max_amount %d", c.TokenTTL, c.Limits.MaxGreeting, c.CouponPrefetch, c.Limits.MaxAmount)
	}
	if c, err := cellFromFile(t, oneCell+"cell:\n  degrade: {relay: }\n  coupon_rates: []\n"); err != nil || c.Degrade.Relay || c.CouponRates != def.CouponRates {
		t.Errorf("an empty switch and an empty list: relay off %v, rates %v, %v; want on and the default rates", c.Degrade.Relay, c.CouponRates, err)
	}
	for body, key := range map[string]string{
		"cell:\n  batch_max: 0\n":        "batch_max",
		"cell:\n  map_version: 0\n":      "map_version",
		"cell:\n  move_grace: 0s\n":      "move_grace",
		"cell:\n  lease_ttl: 0s\n":       "lease_ttl",
		"cell:\n  breaker_failures: 0\n": "breaker_failures",
		"cell:\n  coupon_rates: [5]\n":   "coupon_rates",
	} {
		if _, err := cellFromFile(t, oneCell+body); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%q: %v, want an error naming %s", body, err, key)
		}
	}
}
