package clock

import (
	"testing"
	"time"
)

func TestManualFiresWaitersItPasses(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	m := NewManual(start)
	a, b := m.After(time.Second), m.After(3*time.Second)
	m.Advance(2 * time.Second)
	select {
	case got := <-a:
		if !got.Equal(start.Add(2 * time.Second)) {
			t.Fatalf("fired with %v", got)
		}
	default:
		t.Fatal("1 s waiter did not fire after 2 s")
	}
	select {
	case <-b:
		t.Fatal("3 s waiter fired after 2 s")
	default:
	}
	if m.Waiters() != 1 {
		t.Fatalf("waiters %d, want 1", m.Waiters())
	}
	m.Set(start) // backwards: ignored
	if !m.Now().Equal(start.Add(2 * time.Second)) {
		t.Fatalf("clock went back to %v", m.Now())
	}
	m.Advance(time.Second)
	if _, ok := <-b; !ok || m.Waiters() != 0 {
		t.Fatal("3 s waiter did not fire at 3 s")
	}
	select {
	case <-m.After(0):
	default:
		t.Fatal("After(0) must fire at once")
	}
}
