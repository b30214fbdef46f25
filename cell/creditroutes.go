package cell

import (
	"context"
	"net/http"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/cell/moves"
	"redcell/cell/recon"
	"redcell/model"
)

// creditRoutes serves the calls other cells make about credits: the
// relay's deliveries (POST /internal/credits, booked through the writer)
// and reconciliation's questions (POST /internal/recon, read from the
// store of the request's space and the copies of moved databases).
// serveRoute has checked the signature, as for every call. Safe for
// concurrent use.
type creditRoutes struct {
	own     *ownership
	writer  *writer
	moves   *moves.Steps // the copies of databases handed over (inCopies)
	answers answers
}

// creditsPerCallMax bounds the claims one /internal/credits or /internal/recon
// call may carry (the relay sends at most relay.BatchMax).
const creditsPerCallMax = 10_000

// credits applies claims relayed from other cells (signed, as every call:
// serveRoute checked); a credit seen before is a no-op. Credits whose wallet
// row another transaction holds are deferred, not waited for: the answer
// lists them to a sender that reads the list (api.HeaderPartial), and is a
// retryable 503 to one that does not; what was applied stays applied.
func (cr *creditRoutes) credits(ctx context.Context, rc *fasthttp.RequestCtx, sp *space) {
	// The credits may write any of the cell's databases (entersOnItsOwn),
	// through the committer, which registers the writes and checks each
	// shard (commitGroup).
	credits, err := cr.own.decodeCredits(rc.PostBody())
	if err != nil {
		cr.answers.err(rc, err)
		return
	}
	applied, deferred, err := cr.writer.applyCreditsGrouped(ctx, sp, credits)
	if err != nil {
		cr.answers.err(rc, err)
		return
	}
	if len(deferred) > 0 && string(rc.Request.Header.Peek(api.HeaderPartial)) != "1" {
		cr.answers.err(rc, model.Errorf(model.ErrOverloaded, "%d of %d credits deferred: their wallet rows are locked; retry later", len(deferred), len(credits)))
		return
	}
	cr.answers.json(rc, http.StatusOK, api.CreditsResponse{Applied: applied, Deferred: deferred})
}

// reconAnswer serves POST /internal/recon: which of the claims another cell
// delivered here are credited as claimed (recon.Answer). serveRoute has
// checked its signature, as for every call; it reads only.
func (cr *creditRoutes) reconAnswer(ctx context.Context, rc *fasthttp.RequestCtx, sp *space) {
	credits, copied, err := cr.own.decodeRecon(rc.PostBody())
	if err != nil {
		cr.answers.err(rc, err)
		return
	}
	var absent []string // copy: claims of databases this cell keeps no copy of
	if copied {
		if credits, absent, err = cr.inCopies(ctx, credits); err != nil {
			cr.answers.err(rc, err)
			return
		}
	}
	out, err := recon.Answer(ctx, sp.store, credits)
	if err != nil {
		cr.answers.err(rc, err)
		return
	}
	out.Missing = append(out.Missing, absent...)
	cr.answers.json(rc, http.StatusOK, out)
}

// inCopies splits credits into those whose claimant's database this cell
// keeps a copy of (it serves it, or handed it over and has not dropped its
// copy: a moved-out record) and the claim IDs of the rest.
func (cr *creditRoutes) inCopies(ctx context.Context, credits []model.Credit) (kept []model.Credit, absent []string, err error) {
	copies := map[int]bool{}
	dbs, err := cr.moves.Copies(ctx)
	if err != nil {
		return nil, nil, model.Errorf(model.ErrDBUnavailable, "%v", err)
	}
	for _, db := range dbs {
		copies[db] = true
	}
	for _, c := range credits {
		if db := c.Shard.DB(); copies[db] || cr.own.holdsDB(db) {
			kept = append(kept, c)
		} else {
			absent = append(absent, c.ClaimID)
		}
	}
	return kept, absent, nil
}
