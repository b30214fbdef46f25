package storagetest

import (
	"os"
	"strconv"
	"testing"
)

// envSeed is the value of the environment variable env when it is set to a
// number (to replay a failed run), else def.
func envSeed(env string, def uint64) uint64 {
	if v := os.Getenv(env); v != "" {
		if s, err := strconv.ParseUint(v, 10, 64); err == nil {
			return s
		}
	}
	return def
}

// logSeedOnFailure logs, when t has failed by its end, how to replay the
// seeded run (GroupMoney, RewardMoney) through env.
func logSeedOnFailure(t *testing.T, run, env string, seed uint64) {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s seed %d: %s=%d replays this run", run, seed, env, seed)
		}
	})
}
