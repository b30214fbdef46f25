package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"redcell/api"
	"redcell/internal/retry"
	"redcell/model"
)

// requester sends requests and records their outcomes per op; every workload
// uses one. It is safe for concurrent use.
type requester struct {
	c   *client
	rec [opCount]*opRecorder
}

func newRequester(c *client, loadStart time.Time) requester {
	q := requester{c: c}
	for o := range q.rec {
		q.rec[o] = newOpRecorder()
	}
	q.rec[opOpen].tl = newTimeline(loadStart)
	return q
}

// do sends one idempotent request and records each attempt under o. The first
// attempt's latency counts from start (zero: now), so an open-loop run sees the
// time a request waited to be sent; a retry's from its own start. A failure
// marked retryable is tried again (retry.Do), up to attemptsMax times in all,
// after retryBackoff, then twice that, while ctx allows.
// inspect, when set, runs on each 2xx answer after out is decoded: it returns
// whether the answer was a repeat, and a contract breach to record as
// BAD_RESPONSE ("" if none).
func (q *requester) do(ctx context.Context, start time.Time, o op, method, path string, in, out any,
	inspect func() (repeat bool, breach string)) result {
	var res result
	_ = retry.Do(ctx, retry.Policy{Attempts: attemptsMax, Backoff: retryBackoff, Retryable: isRetryable}, func(int) error {
		res = q.c.callFrom(start, method, path, in, out)
		start = time.Time{}
		repeat := false
		if res.code == "" && inspect != nil {
			var breach string
			if repeat, breach = inspect(); breach != "" {
				res.code, res.message = codeBadResponse, breach
			}
		}
		q.rec[o].record(res, repeat)
		if res.code == "" {
			return nil
		}
		return failed{res}
	})
	return res // the last attempt's; retry.Do's error says no more than res
}

// failed is a result that was not a success, as an error for retry.Do.
type failed struct{ result }

func (f failed) Error() string { return f.code + ": " + f.message }

// isRetryable: the failure is worth another attempt.
func isRetryable(err error) bool {
	var f failed
	return errors.As(err, &f) && f.retryable
}

// balance reads one account's balance; an account that does not exist has 0.
func (c *client) balance(act string) (int64, error) {
	var out model.Account
	res := c.call(http.MethodGet, api.AccountPath(act), nil, &out)
	switch res.code {
	case "":
		return int64(out.Balance), nil
	case model.ErrNotFound.Code:
		return 0, nil
	}
	return 0, fmt.Errorf("bench: balance of %s: %s %s", act, res.code, res.message)
}

// balanceCheck is what checkAccounts found.
type balanceCheck struct {
	sum        int64 // of the balances read
	mismatches int   // accounts whose balance differs from their claims
	short      int   // of them, accounts whose balance is below their claims
	shortCents int64 // what those accounts still miss
}

// checkAccounts reads the balance of every acts[i] (balanceReaders at a time)
// and compares each with want[i].
func (c *client) checkAccounts(acts []string, want []int64) (balanceCheck, error) {
	balances := make([]int64, len(acts))
	errs := make([]error, len(acts))
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for range min(balanceReaders, len(acts)) {
		wg.Go(func() {
			for j := int(next.Add(1) - 1); j < len(acts); j = int(next.Add(1) - 1) {
				balances[j], errs[j] = c.balance(acts[j])
			}
		})
	}
	wg.Wait()
	var bc balanceCheck
	for j := range balances {
		if errs[j] != nil {
			return balanceCheck{}, errs[j]
		}
		bc.sum += balances[j]
		if balances[j] != want[j] {
			bc.mismatches++
		}
		if balances[j] < want[j] {
			bc.short++
			bc.shortCents += want[j] - balances[j]
		}
	}
	return bc, nil
}

// settle waits, up to settleTimeout, until every checked account's balance
// equals its claims (balances reads them) and the audit (when set) balances.
// Claims of other traffic may still be in flight; they are the audit's to
// count, not this run's to wait for. An audit already running when the wait
// ends may finish (up to auditTimeout); the last completed report is kept in
// rep. nothingClaimed skips the wait when there is no audit: no credit of this
// run can be in flight, and waiting would only repeat the same answer.
func settle(ctx context.Context, audit func(context.Context) (model.AuditReport, error),
	balances func() (balanceCheck, error), nothingClaimed bool, rep *Report) {
	wait, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	// One check per settleInterval within settleTimeout, and the first.
	checksMax := int(settleTimeout/settleInterval) + 1
	_ = retry.Do(wait, retry.Policy{Attempts: checksMax, Backoff: settleInterval, Max: settleInterval}, func(int) error {
		settled := true
		if audit != nil {
			// ctx, not wait: an audit started before the wait ends may finish.
			actx, cancel := context.WithTimeout(ctx, auditTimeout)
			a, err := audit(actx)
			cancel()
			if err != nil {
				rep.AuditError = err.Error()
				settled = false
			} else {
				// Cells are read one after another, so a difference can be an
				// artifact of a credit landing between two reads: only a balanced
				// report ends the wait.
				rep.Audit, rep.AuditError = &a, ""
				settled = a.OK()
			}
		}
		bc, err := balances()
		if err != nil {
			rep.BalanceError = err.Error()
			settled = false
		} else {
			rep.BalancesChecked, rep.BalanceError = true, ""
			rep.OpenerBalancesCents, rep.BalanceMismatches = bc.sum, bc.mismatches
			rep.BalancesShort, rep.BalancesShortCents = bc.short, bc.shortCents
			settled = settled && bc.mismatches == 0
		}
		if settled || audit == nil && nothingClaimed {
			return nil
		}
		return errUnsettled
	})
}

// errUnsettled: settle's check found the books not settled yet.
var errUnsettled = errors.New("bench: not settled yet")

// sendRequest is the body of a packet send by act.
func sendRequest(act, orderNo string, amount, count int64) api.SendRequest {
	return api.SendRequest{Sender: act, Amount: amount, Count: count, Kind: string(model.KindRandom), Greeting: "bench", OrderNo: orderNo}
}
