package main

import (
	"strings"
	"testing"
	"time"
)

// TestShadowRetentionConfig: shadow_retention reaches the cell (72h unset,
// 0s off); a retention below an hour is refused.
func TestShadowRetentionConfig(t *testing.T) {
	t.Setenv("REDCELL_CLUSTER_SECRET", "reference-config-secret-0123")
	for body, want := range map[string]time.Duration{
		"":                                  72 * time.Hour,
		"cell:\n  shadow_retention: 0s\n":   0,
		"cell:\n  shadow_retention: 1h\n":   time.Hour,
		"cell:\n  shadow_retention: 14d\n":  -1, // not a Go duration: refused by the file's parser
		"cell:\n  shadow_retention: 336h\n": 14 * 24 * time.Hour,
	} {
		c, err := cellFromFile(t, oneCell+body)
		if want < 0 {
			if err == nil {
				t.Errorf("%q: accepted as %s", body, c.ShadowRetention)
			}
			continue
		}
		if err != nil || c.ShadowRetention != want {
			t.Errorf("%q: shadow retention %s, %v; want %s", body, c.ShadowRetention, err, want)
		}
	}
	if _, err := cellFromFile(t, oneCell+"cell:\n  shadow_retention: 30m\n"); err == nil || !strings.Contains(err.Error(), "shadow_retention") {
		t.Errorf("30m: %v, want a shadow_retention error", err)
	}
}
