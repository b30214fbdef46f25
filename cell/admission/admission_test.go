package admission

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"redcell/internal/testenv"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestSlotsCapAndRelease(t *testing.T) {
	mc := NewClient([]string{testenv.Memcached(t)})
	s := NewSlots(mc, 2, quiet)
	key := testenv.Prefix()
	ctx := context.Background()
	r1, err := s.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := s.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := s.Acquire(short, key); !errors.Is(err, ErrBusy) {
		t.Fatalf("third slot with cap 2: %v", err)
	}
	// Another process (another client) sees the same cap.
	other := NewSlots(NewClient([]string{testenv.Memcached(t)}), 2, quiet)
	short2, cancel2 := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel2()
	if _, err := other.Acquire(short2, key); !errors.Is(err, ErrBusy) {
		t.Fatalf("cap not shared across clients: %v", err)
	}
	r1()
	r3, err := other.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("slot not given back: %v", err)
	}
	r2()
	r3()
	if s.Fallbacks.Load() != 0 {
		t.Fatalf("%d fallbacks with memcached up", s.Fallbacks.Load())
	}
}

func TestStaleSlotCounterRecovers(t *testing.T) {
	mc := NewClient([]string{testenv.Memcached(t)})
	s := NewSlots(mc, 1, quiet)
	key := testenv.Prefix()
	// A holder took the only slot a minute ago and never gave it back.
	old := time.Now().Add(-time.Minute).Unix()
	if err := mc.Set(&memcache.Item{Key: slotKey(key), Value: formatSlot(nil, 1, old), Expiration: 300}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	release, err := s.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("stale counter still blocks: %v", err)
	}
	release()
}

func TestFallbackWhenMemcachedIsDown(t *testing.T) {
	s := NewSlots(NewClient([]string{"127.0.0.1:1"}), 1, quiet)
	ctx := context.Background()
	release, err := s.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if _, err := s.Acquire(short, "k"); !errors.Is(err, ErrBusy) {
		t.Fatalf("in-process cap not enforced: %v", err)
	}
	release()
	if r, err := s.Acquire(ctx, "k"); err != nil {
		t.Fatal(err)
	} else {
		r()
	}
	if s.Fallbacks.Load() < 2 {
		t.Fatalf("fallbacks %d", s.Fallbacks.Load())
	}
}

func TestGrabCacheFillNeverOverwrites(t *testing.T) {
	c := NewCache(NewClient([]string{testenv.Memcached(t)}), quiet)
	key := testenv.Prefix()
	c.Set(key, Remaining{Count: 0, Status: 1, ExpiresMS: 42}, time.Minute)  // the worker: sold out
	c.Fill(key, Remaining{Count: 1, Status: 0, ExpiresMS: 42}, time.Minute) // an older read after a miss
	r, ok := c.Get(key)
	if !ok || r.Count != 0 || r.Status != 1 || r.ExpiresMS != 42 {
		t.Fatalf("cache holds %+v (ok %v), want the worker's sold-out state", r, ok)
	}
	if _, ok := c.Get(key + "-missing"); ok {
		t.Fatal("a miss read as a hit")
	}
}
