// Package model holds redcell's domain nouns and rules with no I/O: money, IDs,
// the split of a red packet, and the sentinel errors with their stable codes.
package model

import (
	"fmt"
	"math"
	"math/rand/v2"

	"redcell/internal/invariant"
)

// Cents is an amount of money in cents (fen, 0.01 CNY). Money is never a float.
type Cents int64

// PacketKind is how a red packet splits its total among its shares.
type PacketKind string

const (
	// KindRandom splits with the double-mean rule (see SplitNext).
	KindRandom PacketKind = "random"
	// KindFixed gives every share amount/count; amount must be a multiple of count.
	KindFixed PacketKind = "fixed"
)

// SplitNext returns the next share of a random packet that still holds remaining
// cents for remainingCount shares: the double-mean split, as WeChat describes it.
// Each draw is uniform in [1, 2*remaining/remainingCount], capped so every later
// share can still get 1 cent; the last share takes the exact remainder.
// It panics if remainingCount < 1 or remaining < remainingCount (a bug upstream:
// send rejects count > amount and the packet row never lets that happen).
func SplitNext(remaining Cents, remainingCount int64, r *rand.Rand) Cents {
	invariant.That(remainingCount >= 1, "split with no share left")
	invariant.That(int64(remaining) >= remainingCount, "split with less than a cent per share")
	if remainingCount == 1 {
		return remaining
	}
	// No overflow: Limits.Validate keeps totals below MaxInt64/4.
	maxShare := Cents(2 * int64(remaining) / remainingCount)
	capShare := remaining - Cents(remainingCount-1)
	if maxShare > capShare {
		maxShare = capShare
	}
	if maxShare < 1 {
		maxShare = 1
	}
	share := Cents(1 + r.Int64N(int64(maxShare)))
	invariant.That(share >= 1 && share <= capShare, "split share out of range")
	return share
}

// FixedShare returns the share of a fixed packet: total/count. Send guarantees that
// total is a multiple of count.
func FixedShare(total Cents, count int64) Cents {
	invariant.That(count >= 1 && int64(total)%count == 0, "fixed packet not divisible")
	return Cents(int64(total) / count)
}

// Split draws all count shares of a packet at once (used by tests and the bench;
// the cell draws shares one open at a time with SplitNext).
func Split(kind PacketKind, total Cents, count int64, r *rand.Rand) []Cents {
	shares := make([]Cents, 0, count)
	remaining := total
	for left := count; left > 0; left-- {
		var s Cents
		if kind == KindFixed {
			s = FixedShare(total, count)
		} else {
			s = SplitNext(remaining, left, r)
		}
		shares = append(shares, s)
		remaining -= s
	}
	invariant.That(remaining == 0, "split must conserve total")
	return shares
}

// MaxShares is the most shares any packet may have, whatever the config says.
const MaxShares = 99_999_999

// Limits are the per-packet bounds enforced at send.
// The YAML keys are a cell config file's (cell.Config).
type Limits struct {
	MaxAmount   Cents `yaml:"max_amount"`   // largest packet total, cents
	MaxCount    int64 `yaml:"max_count"`    // most shares in one packet
	MaxGreeting int   `yaml:"max_greeting"` // longest greeting, in runes
}

// DefaultLimits allow a red-packet rain: one packet can last a whole hot run.
func DefaultLimits() Limits {
	return Limits{MaxAmount: 10_000_000, MaxCount: 10_000_000, MaxGreeting: 64}
}

// CheckShares applies the send rules to a packet of amount cents in count shares:
// amount 1..MaxAmount, count 1..MaxCount, and count <= amount, since every share
// gets at least 1 cent. A packet that passes can be drawn with SplitNext without
// tripping its invariants (FuzzSplit checks this). Errors: ErrInvalidArgument.
func (l Limits) CheckShares(amount Cents, count int64) error {
	if amount < 1 || amount > l.MaxAmount {
		return Invalidf("amount must be 1..%d cents", l.MaxAmount)
	}
	if count < 1 || count > l.MaxCount {
		return Invalidf("count must be 1..%d", l.MaxCount)
	}
	if count > int64(amount) {
		return Invalidf("count %d is above amount %d: every share needs at least 1 cent", count, amount)
	}
	return nil
}

// Validate checks the limits themselves.
func (l Limits) Validate() error {
	if l.MaxAmount < 1 || l.MaxCount < 1 || l.MaxGreeting < 0 {
		return fmt.Errorf("model: limits must be positive: %+v", l)
	}
	if int64(l.MaxAmount) > math.MaxInt64/4 {
		return fmt.Errorf("model: MaxAmount %d too large", l.MaxAmount)
	}
	if l.MaxCount > MaxShares {
		return fmt.Errorf("model: MaxCount %d above %d (claim IDs carry at most 8 digits of sequence)", l.MaxCount, MaxShares)
	}
	if l.MaxGreeting > 256 {
		return fmt.Errorf("model: MaxGreeting %d above the 256 characters the packet row holds", l.MaxGreeting)
	}
	return nil
}
