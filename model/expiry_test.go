package model

import (
	"fmt"
	"testing"
	"time"
)

func TestExpiryDays(t *testing.T) {
	at := func(s string) time.Time {
		tm, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	for _, tc := range []struct {
		now    string
		expiry time.Duration
		want   string
	}{
		{"2026-11-30T12:00:00Z", 5 * time.Second, "[29 30]"},
		{"2026-11-30T12:00:00Z", 24 * time.Hour, "[28 29 30]"},
		{"2026-03-02T10:00:00Z", 24 * time.Hour, "[28 1 2]"},     // 2026 is not a leap year
		{"2028-03-01T00:00:00Z", 24 * time.Hour, "[28 29 1]"},    // 2028 is
		{"2026-01-01T00:00:00Z", 0, "[31 1]"},                    // across the year
		{"2026-01-01T07:30:00+08:00", 0, "[30 31]"},              // read in UTC: still Dec 31
		{"2026-05-10T23:59:59Z", 72 * time.Hour, "[6 7 8 9 10]"}, // whole days back
		{"2026-05-10T00:00:00Z", 72*time.Hour - time.Second, "[6 7 8 9 10]"},
	} {
		if got := fmt.Sprint(ExpiryDays(at(tc.now), tc.expiry)); got != tc.want {
			t.Errorf("ExpiryDays(%s, %v) = %s, want %s", tc.now, tc.expiry, got, tc.want)
		}
	}
	all := AllDays()
	if len(all) != DaySlots || all[0] != 1 || all[30] != 31 {
		t.Fatalf("AllDays() = %v", all)
	}
	all[0] = 99
	if AllDays()[0] != 1 {
		t.Fatal("AllDays shares its slice between calls")
	}
}
