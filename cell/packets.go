package cell

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/cell/admission"
	"redcell/cell/degrade"
	"redcell/internal/clock"
	"redcell/model"
	"redcell/storage"
)

// packets serves the packet routes but the open (the Server's own hot
// path, open.go): a send, a grab and a packet's detail; and reads what a
// grab and an open share from a request (packetAndActor). It reads the
// store of the request's space, the grab cache and the degrade switches,
// and writes through the writer; serveRoute has checked the signature, the
// rate limit and the space. Safe for concurrent use.
type packets struct {
	own      *ownership
	writer   *writer
	cache    *grabCache // nil: none
	switches *degrade.Switches
	answers  answers
	clock    clock.Clock
	limits   model.Limits  // a send's bounds (Config.Limits)
	expiry   time.Duration // a new packet's life (Config.PacketExpiry)
}

func (pk *packets) send(ctx context.Context, rc *fasthttp.RequestCtx, sp *space) {
	var body api.SendRequest
	if err := decodeStrict(rc.PostBody(), &body); err != nil {
		pk.answers.err(rc, err)
		return
	}
	req, sh, err := validateSend(body, pk.limits)
	if err != nil {
		pk.answers.err(rc, err)
		return
	}
	// The send writes its sender's database only (entersOnItsOwn): the
	// debit, the flow and the packet, whose ID carries the sender's shard;
	// through the committer, which registers the write and checks the shard
	// again (commitGroup).
	if err := pk.own.check(sh); err != nil {
		pk.answers.err(rc, err)
		return
	}
	now := pk.clock.Now()
	id, expiresMS := model.NewPacketID(sh, now), now.Add(pk.expiry).UnixMilli()
	p, repeat, err := pk.writer.sendGrouped(ctx, sp, sh, req, id, expiresMS)
	if err != nil {
		pk.answers.err(rc, err)
		return
	}
	if !repeat {
		pk.cache.set(sp, p)
	}
	pk.answers.json(rc, http.StatusOK, api.NewSendResponse(p, repeat))
}

// statusOf names a packet's state at time now (model.StatusAt).
func statusOf(st model.PacketStatus, remaining int64, expiresMS int64, now time.Time) string {
	return model.StatusAt(st, remaining, expiresMS, now.UnixMilli())
}

// packetAndActor reads what grab and open share: the packet ID from the path
// (owned by this cell) and the act_id from the body, both validated. On failure
// it has written the error answer and ok is false.
func (pk *packets) packetAndActor(rc *fasthttp.RequestCtx, id string) (ref model.PacketRef, actID string, ok bool) {
	ref, err := pk.own.packetRef(id)
	if err == nil {
		actID, err = decodeActID(rc.PostBody())
	}
	if err == nil {
		err = model.ValidateActID(actID)
	}
	if err != nil {
		pk.answers.err(rc, err)
		return ref, "", false
	}
	return ref, actID, true
}

// grab answers whether a share may still be there: memcached's copy first, the
// database on a miss (and always while the grab_cache switch is off). It never
// reserves anything.
func (pk *packets) grab(ctx context.Context, rc *fasthttp.RequestCtx, sp *space, id string) {
	ref, _, ok := pk.packetAndActor(rc, id)
	if !ok {
		return
	}
	rem, ok := admission.Remaining{}, false
	source := "cache"
	useCache := pk.cache != nil && !pk.switches.Off(degrade.GrabCache)
	if useCache {
		rem, ok = pk.cache.get(sp, ref.ID)
	}
	if ok && rem.Local {
		source = "local"
	}
	if !ok {
		p, err := storage.Packet(ctx, sp.store, ref)
		if err != nil {
			pk.answers.err(rc, err)
			return
		}
		if useCache {
			pk.cache.fill(sp, p)
		}
		rem, source = remainingOf(p), "db"
	}
	st := statusOf(model.PacketStatus(rem.Status), rem.Count, rem.ExpiresMS, pk.clock.Now())
	pk.answers.json(rc, http.StatusOK, api.NewGrabResponse(id, st, rem.Count, source))
}

// detail answers GET /v1/packets/{id}?after=SEQ&limit=N with the packet and one
// page of its claims (limit 1..100, default 20).
func (pk *packets) detail(ctx context.Context, rc *fasthttp.RequestCtx, sp *space, id string) {
	ref, err := pk.own.packetRef(id)
	if err != nil {
		pk.answers.err(rc, err)
		return
	}
	after, limit := int64(0), 20
	if v := rc.QueryArgs().Peek("after"); len(v) > 0 {
		if after, err = strconv.ParseInt(string(v), 10, 64); err != nil || after < 0 {
			pk.answers.err(rc, model.Invalidf("after must be a claim seq >= 0"))
			return
		}
	}
	if v := rc.QueryArgs().Peek("limit"); len(v) > 0 {
		if limit, err = strconv.Atoi(string(v)); err != nil || limit < 1 || limit > 100 {
			pk.answers.err(rc, model.Invalidf("limit must be 1..100"))
			return
		}
	}
	p, err := storage.Packet(ctx, sp.store, ref)
	if err != nil {
		pk.answers.err(rc, err)
		return
	}
	var claims []model.Claim
	degraded := pk.switches.Off(degrade.ClaimsList)
	if !degraded {
		if claims, err = storage.Claims(ctx, sp.store, ref, after, limit); err != nil {
			pk.answers.err(rc, err)
			return
		}
	}
	out := api.PacketResponse{ClaimsDegraded: degraded,
		PacketID: string(p.ID), Sender: p.Sender, Kind: string(p.Kind), Greeting: p.Greeting, Amount: int64(p.Amount),
		Count: p.Count, RemainingAmount: int64(p.RemainingAmount), RemainingCount: p.RemainingCount,
		RefundAmount: int64(p.RefundAmount), Status: statusOf(p.Status, p.RemainingCount, p.ExpiresMS, pk.clock.Now()),
		CreatedMS: p.CreatedMS, ExpiresMS: p.ExpiresMS, Claims: claims,
		ExpiresAt: time.UnixMilli(p.ExpiresMS).UTC().Format(time.RFC3339Nano),
	}
	if out.Claims == nil {
		out.Claims = []model.Claim{}
	}
	if len(claims) == limit {
		out.NextAfter = claims[len(claims)-1].Seq
	}
	pk.answers.json(rc, http.StatusOK, out)
}
