package audit

import (
	"context"
	"time"

	"redcell/model"
)

// holdPoll is how often Hold asks again whether the audit that runs is done.
const holdPoll = 20 * time.Millisecond

// Hold waits until no audit runs and keeps any from starting until release
// is called: the shadow cleanup (cell.shadowCleaner) drops the shadow
// tables between two audits, never under one, so no audit reads a space
// half dropped. Meanwhile Audit waits and TryAudit answers ErrOverloaded.
// It polls every holdPoll on the auditor's clock (an audit takes seconds to
// minutes) until ctx ends: then ErrOverloaded, and nothing is held. release
// must be called exactly once.
func (a *Auditor) Hold(ctx context.Context) (release func(), err error) {
	for !a.mu.TryLock() {
		select {
		case <-ctx.Done():
			return nil, model.Errorf(model.ErrOverloaded, "an audit of this cell is running; retry when it is done")
		case <-a.clock.After(holdPoll):
		}
	}
	return a.mu.Unlock, nil
}
