package model

import "time"

// DaySlots is the number of day-of-month packet tables (t_packet_y_01 ..
// t_packet_y_31): a packet lives in the table of the UTC day it was created on.
const DaySlots = 31

// AllDays returns every day slot, 1..DaySlots, in a new slice: what a full
// expiry scan reads.
func AllDays() []int {
	d := make([]int, DaySlots)
	for i := range d {
		d[i] = i + 1
	}
	return d
}

// ExpiryDays lists the days of month (1..31, oldest first, each once) whose
// tables may hold open packets that have expired by now, for packets living
// expiry: from the UTC day one day before the oldest creation time that could
// have expired by now (now - expiry - 24h), to now's UTC day. The extra day
// covers a packet created just before midnight. expiry must be >= 0 and, for
// the list to hold each day once, under about 29 days; longer lives are left to
// the full scan over AllDays.
func ExpiryDays(now time.Time, expiry time.Duration) []int {
	now = now.UTC()
	start := now.Add(-expiry - 24*time.Hour)
	var days []int
	for d := time.Date(start.Year(), start.Month(), start.Day(), 0, 0, 0, 0, time.UTC); !d.After(now); d = d.AddDate(0, 0, 1) {
		days = append(days, d.Day())
	}
	return days
}
