package bench

import "sync"

// claimBook tracks the claims of the sampled accounts. Safe for concurrent use.
type claimBook struct {
	mu    sync.Mutex       // guards byAct
	byAct map[string]int64 // cents claimed by each sampled account
}

// sample reports whether act's claims are tracked and its balance read after
// the run: the first balanceSampleMax accounts offered are, for every claim.
func (b *claimBook) sample(act string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.byAct[act]; ok {
		return true
	}
	if len(b.byAct) >= balanceSampleMax {
		return false
	}
	b.byAct[act] = 0
	return true
}

func (b *claimBook) add(act string, cents int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.byAct[act] += cents
}

func (b *claimBook) snapshot() (acts []string, want []int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for a, c := range b.byAct {
		acts, want = append(acts, a), append(want, c)
	}
	return acts, want
}

// uncertainOpenList is a bounded list of opens to ask about again.
type uncertainOpenList struct {
	mu    sync.Mutex // guards tasks and over
	tasks []openTask
	over  int64 // tasks that did not fit
}

func (u *uncertainOpenList) add(t openTask) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.tasks) >= uncertainMax {
		u.over++
		return
	}
	u.tasks = append(u.tasks, t)
}
