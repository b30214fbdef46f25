package cell

import (
	"context"

	"redcell/api"
	"redcell/api/cellclient"
	"redcell/model"
)

// cellCalls are the calls this cell makes to other cells, for one space,
// through the one cell client (api/cellclient: signed, deadline from ctx,
// ended when ctx is, stress traffic marked): the relay's credits and
// reconciliation's questions.
type cellCalls struct {
	c      *cellclient.Client
	stress bool
}

// Credits posts credits to the cell at addr (POST /internal/credits) and
// returns its answer: which claims it deferred. Errors: *cellclient.Error.
func (cc cellCalls) Credits(ctx context.Context, addr string, cs []model.Credit) (api.CreditsResponse, error) {
	var out api.CreditsResponse
	err := cc.c.Send(ctx, cellclient.Call{Addr: addr, Path: api.CreditsPath, Stress: cc.stress, Partial: true,
		Body: api.CreditsRequest{Credits: cs}, Out: &out})
	return out, err
}

// Recon asks the cell at addr which of cs it has credited (POST
// /internal/recon). Errors: *cellclient.Error.
func (cc cellCalls) Recon(ctx context.Context, addr string, cs []model.Credit) (api.ReconResponse, error) {
	return cc.recon(ctx, addr, api.ReconRequest{Credits: cs})
}

// ReconCopy asks the cell at addr which of cs it has credited in its own
// copy of their claimants' databases, served now or handed over (POST
// /internal/recon with copy set). Errors: *cellclient.Error.
func (cc cellCalls) ReconCopy(ctx context.Context, addr string, cs []model.Credit) (api.ReconResponse, error) {
	return cc.recon(ctx, addr, api.ReconRequest{Credits: cs, Copy: true})
}

func (cc cellCalls) recon(ctx context.Context, addr string, req api.ReconRequest) (api.ReconResponse, error) {
	var out api.ReconResponse
	err := cc.c.Send(ctx, cellclient.Call{Addr: addr, Path: api.ReconPath, Stress: cc.stress, Body: req, Out: &out})
	return out, err
}
