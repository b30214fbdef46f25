package cell

import (
	"redcell/api"
	"redcell/cell/strictjson"
	"redcell/model"
	"redcell/sharding"
)

// ownership is which shards this cell owns, and the checks of the keys in a
// request against it. Read-only after New: safe for concurrent use.
type ownership struct {
	cell  string // this cell's name, for the errors
	owned [model.ShardCount]bool
}

func newOwnership(cell string, shards sharding.Ranges) *ownership {
	o := &ownership{cell: cell}
	for _, sh := range shards.Shards() {
		o.owned[sh] = true
	}
	return o
}

// owns reports whether this cell owns shard sh.
func (o *ownership) owns(sh model.ShardID) bool { return sh.Valid() && o.owned[sh] }

// wrongCell is the error of a key of a shard another cell owns.
func (o *ownership) wrongCell(sh model.ShardID) error {
	return model.Errorf(model.ErrWrongCell, "shard %d is not owned by %s", sh, o.cell)
}

// account validates an act_id from the path and checks this cell owns its
// shard. Errors: ErrInvalidArgument, ErrWrongCell.
func (o *ownership) account(actID string) (model.ShardID, error) {
	if err := model.ValidateActID(actID); err != nil {
		return 0, err
	}
	sh := sharding.ShardOfAct(actID)
	if !o.owns(sh) {
		return 0, o.wrongCell(sh)
	}
	return sh, nil
}

// identity splits and validates the app account of an identity path
// ("{app}/{app_user_id}") and checks this cell owns its home shard
// (sharding.ShardOfIdentity). Errors: ErrInvalidArgument, ErrWrongCell.
func (o *ownership) identity(key string) (sh model.ShardID, app, appUserID string, err error) {
	app, appUserID, err = api.SplitIdentityKey(key)
	if err != nil {
		return 0, "", "", err
	}
	sh = sharding.ShardOfIdentity(app, appUserID)
	if !o.owns(sh) {
		return 0, "", "", o.wrongCell(sh)
	}
	return sh, app, appUserID, nil
}

// packetRef parses a packet ID from the path and checks this cell owns its
// shard. Errors: ErrInvalidArgument, ErrWrongCell.
func (o *ownership) packetRef(id string) (model.PacketRef, error) {
	ref, err := model.ParsePacketID(id)
	if err != nil {
		return ref, err
	}
	if !o.owns(ref.Shard) {
		return ref, o.wrongCell(ref.Shard)
	}
	return ref, nil
}

// decodeCredits reads the body of /internal/credits and /internal/recon
// ({"credits": [...]}, strict) and checks every credit: each names a claim of
// its packet and a claimant of a shard this cell owns. Errors:
// ErrInvalidArgument, ErrWrongCell.
func (o *ownership) decodeCredits(body []byte) ([]model.Credit, error) {
	var req api.CreditsRequest
	if err := strictjson.Decode(body, &req); err != nil {
		return nil, err
	}
	if len(req.Credits) > creditsPerCallMax {
		return nil, model.Invalidf("at most %d credits per call", creditsPerCallMax)
	}
	for _, c := range req.Credits {
		if err := o.validCredit(c); err != nil {
			return nil, err
		}
	}
	return req.Credits, nil
}

func (o *ownership) validCredit(c model.Credit) error {
	ref, _, err := model.ParseClaimID(c.ClaimID)
	if err != nil {
		return err
	}
	if ref.ID != c.PacketID {
		return model.Invalidf("claim %s does not belong to packet %s", c.ClaimID, c.PacketID)
	}
	if err := model.ValidateActID(c.ActID); err != nil {
		return err
	}
	if sharding.ShardOfAct(c.ActID) != c.Shard {
		return model.Invalidf("credit shard %d does not match act_id", c.Shard)
	}
	if !o.owns(c.Shard) {
		return o.wrongCell(c.Shard)
	}
	if c.Amount < 1 {
		return model.Invalidf("credit amount must be >= 1")
	}
	return nil
}
