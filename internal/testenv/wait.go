package testenv

import (
	"strings"
	"testing"
	"time"
)

// PollEvery is how often Until looks at its condition: short next to the
// waits it serves (a server answering, a goroutine reaching a state), long
// enough not to load the machine.
const PollEvery = 5 * time.Millisecond

// Until polls cond every PollEvery until it holds or limit has passed on the
// real clock, and reports whether it held (cond is looked at once more at the
// limit). It is for waits on real I/O and on goroutines the test cannot
// synchronise with otherwise; give it a limit far above the normal time, so a
// slow machine makes a test slower, never wrong. Inside a synctest bubble
// the clock is the bubble's: each PollEvery passes in fake time (use it there
// only for code that moves on its own timers; synctest.Wait says when
// goroutines have settled).
func Until(limit time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(limit); !cond(); time.Sleep(PollEvery) {
		if time.Now().After(deadline) {
			return cond()
		}
	}
	return true
}

// WaitFor is Until that fails the test, naming what it waited for, when cond
// did not hold within limit. Call it from the test's goroutine (t.Fatalf).
func WaitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Until(limit, cond) {
		t.Fatalf("waited %v for %s", limit, what)
	}
}

// WantPanic runs f and fails the test (as name) unless f panics with a
// message holding want: how the tests of an invariant.That show it fires.
func WantPanic(t testing.TB, name, want string, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		msg, _ := recover().(string)
		if want == "" || !strings.Contains(msg, want) {
			t.Errorf("%s: panic %q, want one holding %q", name, msg, want)
		}
	}()
	f()
}
