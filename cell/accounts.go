package cell

import (
	"bytes"
	"context"
	"net/http"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/internal/clock"
	"redcell/model"
	"redcell/storage"
)

// accounts serves the account routes: an account's balance, a deposit and
// the binding of an app account to its actID. It reads the store of the
// request's space and writes through the writer; serveRoute has checked
// the signature, the rate limit and the space. Safe for concurrent use.
type accounts struct {
	own     *ownership
	writer  *writer
	answers answers
	clock   clock.Clock
	// identityKey keys the identity hashes (Config.IdentityKey; "": binding
	// off), identityRegion is a bare number's region
	// (Config.IdentityDefaultRegion).
	identityKey, identityRegion string
}

func (a *accounts) getAccount(ctx context.Context, rc *fasthttp.RequestCtx, sp *space, actID string) {
	sh, err := a.own.account(actID)
	if err != nil {
		a.answers.err(rc, err)
		return
	}
	acc, err := storage.Account(ctx, sp.store, sh, actID)
	if err != nil {
		a.answers.err(rc, err)
		return
	}
	a.answers.json(rc, http.StatusOK, acc)
}

func (a *accounts) deposit(ctx context.Context, rc *fasthttp.RequestCtx, sp *space, actID string) {
	// The deposit writes its account's database only (entersOnItsOwn),
	// through the committer, which registers the write and checks the shard
	// (commitGroup).
	sh, err := a.own.account(actID)
	if err != nil {
		a.answers.err(rc, err)
		return
	}
	var req api.DepositRequest
	if err := decodeStrict(rc.PostBody(), &req); err != nil {
		a.answers.err(rc, err)
		return
	}
	if err := validateDeposit(req); err != nil {
		a.answers.err(rc, err)
		return
	}
	d, err := a.writer.depositGrouped(ctx, sp, sh, actID, req.OrderNo, model.Cents(req.Amount))
	if err != nil {
		a.answers.err(rc, err)
		return
	}
	a.answers.json(rc, http.StatusOK, d)
}

// bindIdentity answers PUT /v1/identities/{app}/{app_user_id} {"phone"?}: the
// app account's actID, bound now or before (model.Bind). The phone is used
// only to derive the actID and its keyed hash; no answer, error or log line
// repeats it.
func (a *accounts) bindIdentity(ctx context.Context, rc *fasthttp.RequestCtx, sp *space, key string) {
	sh, app, appUserID, err := a.own.identity(key)
	if err != nil {
		a.answers.err(rc, err)
		return
	}
	if a.identityKey == "" {
		a.answers.err(rc, model.ErrIdentityDisabled)
		return
	}
	var req api.IdentityRequest
	if body := rc.PostBody(); len(bytes.TrimSpace(body)) > 0 {
		if err := decodeStrict(body, &req); err != nil {
			a.answers.err(rc, err)
			return
		}
	}
	idKey := []byte(a.identityKey)
	var phone model.Phone
	if req.Phone != nil {
		if phone, err = model.ParsePhone(*req.Phone, a.identityRegion); err != nil {
			a.answers.err(rc, err)
			return
		}
	}
	// Keyed on the number's E.164 form; a binding stored before numbers were
	// parsed holds the hash of a legacy form and keeps its actID.
	want := model.NewBinding(idKey, app, appUserID, phone.E164, a.clock.Now().UnixMilli())
	b, repeat, err := storage.BindIdentity(ctx, sp.store, sh, want, model.LegacyPhoneHashes(idKey, phone)...)
	if err != nil {
		a.answers.err(rc, err)
		return
	}
	a.answers.json(rc, http.StatusOK, api.NewIdentityResponse(b, repeat))
}
