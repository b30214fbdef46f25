package sim

import (
	"errors"
	"fmt"
	"time"
)

// Config is one simulation run. The zero value is not runnable: start from
// DefaultConfig(seed, steps).
type Config struct {
	// Seed decides everything random in the run.
	Seed uint64
	// Steps is how many workload operations the clients start (deposits,
	// sends, opens, grabs, account reads, repeats of earlier orders). Retries
	// of an operation are not steps, but they are requests (Result.Ops).
	Steps int
	// AuditEvery: a full audit of every cell's rows (model.Audit and
	// model.AuditCell, what `redcell audit` checks) runs after every
	// AuditEvery steps; the incremental checks run after every event.
	AuditEvery int
	// Faults are the network, crash and store faults injected while the
	// workload runs; at the end the network heals and every cell is up.
	Faults Faults
	// Grouped runs the cells as strategy grouped does: deposits, sends,
	// open batches and credit batches wait groupLinger in their database's
	// commit lane and are committed together (storage.Grouper.CommitGroup),
	// instead of one store call each.
	Grouped bool
	// Plant enables a planted bug (tests prove the checkers find it).
	Plant Plant
	// TraceKeys: when set, the run keeps every event-log line that names one
	// of these strings (packet IDs, act IDs, claim IDs, order numbers).
	TraceKeys []string
}

// Faults are probabilities (0..1) and times (ms of simulated time).
type Faults struct {
	Drop      float64 // a message is lost
	Duplicate float64 // a message is delivered twice
	// LatencyMinMS..LatencyMaxMS is a message's normal delay, uniform.
	LatencyMinMS, LatencyMaxMS int64
	// Slow is the chance a message takes up to SlowMaxMS instead (it overtakes
	// nothing; later messages overtake it: reordering).
	Slow      float64
	SlowMaxMS int64
	// CrashMeanMS is the mean time between cell crashes (0: none); a crashed
	// cell is down DownMinMS..DownMaxMS, then restarts.
	CrashMeanMS          int64
	DownMinMS, DownMaxMS int64
	// CutMeanMS is the mean time between cuts of one link between two nodes
	// (0: none); a cut lasts up to CutMaxMS.
	CutMeanMS, CutMaxMS int64
	// StoreFail is the chance that a store call that writes fails at its
	// COMMIT (memstore.FailNextCommit); half of those lose only the answer:
	// the write is applied and the caller is told it failed.
	StoreFail float64
	// Defer is the chance that ApplyCredits leaves a credit for a later call,
	// as the MariaDB store does when another transaction holds the wallet
	// row; the in-memory store never has a row held (see lockedRows).
	Defer float64
}

// Plant names a bug to plant.
type Plant int

const (
	// PlantNone: production behaviour.
	PlantNone Plant = iota
	// PlantCreditTwice wraps every cell's store so that ApplyCredits books
	// again, under a new order number, a credit whose order number
	// "claim:<id>" had been booked before: a credit applied without its
	// idempotency key.
	PlantCreditTwice
)

// DefaultConfig is the configuration `make sim` runs: faults on every path,
// often enough that each kind happens hundreds of times in a run.
func DefaultConfig(seed uint64, steps int) Config {
	return Config{
		Seed:       seed,
		Steps:      steps,
		AuditEvery: 10_000, // 10 full audits in a 100,000-step run: each reads every row, half the run's CPU at 5,000
		Faults: Faults{
			Drop:         0.01, // 1 in 100 messages: most operations see a retry or two per run of 100
			Duplicate:    0.01,
			LatencyMinMS: 1,
			LatencyMaxMS: 10,
			Slow:         0.02, // a slow message arrives after many later ones
			SlowMaxMS:    400,
			CrashMeanMS:  4_000, // a crash every ~4 s of simulated time: some 25 per 100 s run
			DownMinMS:    100,
			DownMaxMS:    2_000,
			CutMeanMS:    5_000,
			CutMaxMS:     1_500,
			StoreFail:    0.005,
			Defer:        0.02,
		},
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	f := c.Faults
	switch {
	case c.Steps < 1:
		return errors.New("sim: Steps must be >= 1")
	case c.AuditEvery < 1:
		return errors.New("sim: AuditEvery must be >= 1")
	case !prob(f.Drop) || !prob(f.Duplicate) || !prob(f.Slow) || !prob(f.StoreFail) || !prob(f.Defer):
		return fmt.Errorf("sim: fault probabilities must be in 0..1: %+v", f)
	case f.Drop > 0.5:
		return errors.New("sim: Drop above 0.5 leaves too little to simulate")
	case f.LatencyMinMS < 1 || f.LatencyMaxMS < f.LatencyMinMS || f.SlowMaxMS < 0:
		return fmt.Errorf("sim: latencies must satisfy 1 <= min <= max: %+v", f)
	case f.CrashMeanMS < 0 || f.DownMinMS < 0 || f.DownMaxMS < f.DownMinMS || f.CutMeanMS < 0 || f.CutMaxMS < 0:
		return fmt.Errorf("sim: crash and cut times must be >= 0 and min <= max: %+v", f)
	}
	return nil
}

func prob(p float64) bool { return p >= 0 && p <= 1 }

// The simulated cluster's timing, in simulated time.
const (
	cellCount      = 3
	openLinger     = 2 * time.Millisecond   // a packet's opens wait this long to be batched
	openBatchMax   = 32                     // opens per OpenBatch at most
	groupLinger    = 3 * time.Millisecond   // Grouped: an op waits this long in its lane for others to join its group
	groupMax       = 64                     // Grouped: ops per group at most
	serviceTime    = 1 * time.Millisecond   // a cell answers this long after its store call
	requestTimeout = 300 * time.Millisecond // a client gives an attempt up after this
	attemptsMax    = 8                      // tries of one operation, the first included
	relayInterval  = 100 * time.Millisecond // relay tick period: reads, offers again, saves (cell.Config.RelayInterval)
	relayTimeout   = 1 * time.Second        // one delivery to another cell
	expiryInterval = 500 * time.Millisecond // expiry pass period (cell.Config.ExpiryInterval)
	packetExpiry   = 5 * time.Second        // a packet's life (cell.Config.PacketExpiry): short, so that packets expire all through a run
	opGapMaxMS     = 2                      // a client starts an operation every 0..2 ms
	userCount      = 400
)
