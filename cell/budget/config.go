package budget

import (
	"errors"
	"time"
)

// Config tunes a Pool. A zero field takes its default (DefaultConfig).
type Config struct {
	// Chunk is how much of a budget one lease asks for, given the budget's
	// total (cents or pieces); a result below 1 asks for 1. Default
	// max(1, total/200): some 200 home calls spend a budget, so the home
	// row is written a few times a second even at peak, while a lease a
	// dead cell leaves behind holds at most 0.5% of it.
	Chunk func(total int64) int64
	// TTL is how long a lease is spent from; then its unspent part goes back
	// (Sweep) and the next Take takes a new one. The home expires it at the
	// same TTL from its own clock. Default 60 s: a cell that dies holds its
	// leases' remainders for a minute at most before a restarted cell or an
	// operator may settle them.
	TTL time.Duration
	// Reserve is what the home holds back from leases of a key, given the
	// key's total: issuing stops when Total − Outstanding reaches it. It is
	// asked at each lease fetch, so a reload that changes it counts from the
	// next lease. Default total/10, as the seed stopped issuing at 10% of
	// stock left; the cell answers each scene's reserve_percent. A result
	// below 0 is 0.
	Reserve func(key string, total int64) int64
	// RefillBelow, in (0, 1): when what the usable leases of a key have left
	// falls below this fraction of a chunk, or the newest of them has less
	// than this fraction of TTL to run, the next lease is fetched in the
	// background, so Takes rarely wait for the home. Default 0.25.
	RefillBelow float64
	// FetchTimeout bounds one home call for a new lease. Default 5 s, the
	// router's deadline for a whole request: Takes that wait for the fetch
	// give up with their own ctx before it.
	FetchTimeout time.Duration
	// ExhaustedWait: after the home answered a key exhausted (or granted
	// less than asked), Takes the held leases cannot serve fail at once for
	// this long instead of asking the home again. Default 1 s: the home is
	// not asked at request rate once a scene is spent, and a budget raised
	// or returned is seen within a second.
	ExhaustedWait time.Duration
}

// DefaultConfig is the configuration every zero field of a Config takes.
func DefaultConfig() Config {
	return Config{
		Chunk:         func(total int64) int64 { return max(1, total/200) },
		TTL:           60 * time.Second,
		Reserve:       func(_ string, total int64) int64 { return total / 10 },
		RefillBelow:   0.25,
		FetchTimeout:  5 * time.Second,
		ExhaustedWait: time.Second,
	}
}

// withDefaults fills c's zero fields from DefaultConfig.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Chunk == nil {
		c.Chunk = d.Chunk
	}
	if c.TTL == 0 {
		c.TTL = d.TTL
	}
	if c.Reserve == nil {
		c.Reserve = d.Reserve
	}
	if c.RefillBelow == 0 {
		c.RefillBelow = d.RefillBelow
	}
	if c.FetchTimeout == 0 {
		c.FetchTimeout = d.FetchTimeout
	}
	if c.ExhaustedWait == 0 {
		c.ExhaustedWait = d.ExhaustedWait
	}
	return c
}

// Validate checks c with its defaults filled in.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.TTL < time.Second {
		errs = append(errs, errors.New("budget: TTL must be >= 1s"))
	}
	if !(c.RefillBelow > 0 && c.RefillBelow < 1) {
		errs = append(errs, errors.New("budget: RefillBelow must be in (0, 1)"))
	}
	if c.FetchTimeout <= 0 || c.FetchTimeout >= c.TTL {
		errs = append(errs, errors.New("budget: FetchTimeout must be > 0 and below TTL (a lease must outlive its fetch)"))
	}
	if c.ExhaustedWait < 0 {
		errs = append(errs, errors.New("budget: ExhaustedWait must be >= 0"))
	}
	return errors.Join(errs...)
}
