package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"redcell/api"
	"redcell/api/cellclient"
	"redcell/model"
)

// noopStripes is how many recorders the no-op workers share: worker i records
// into stripe i % noopStripes, so a few hundred workers do not queue on one
// lock (profiled: with one recorder, its mutex was the bench's hottest lock).
const noopStripes = 16

// noopLoad is what one closed-loop no-op measurement sends.
type noopLoad struct {
	c      *client
	cell   string   // the cell that must answer
	acts   []string // cycled over, one per request
	stress bool     // stress mark and signature, as the bench's workloads send; false: an API key request like wrk's
}

// run sends POST api.NoopPath+act closed-loop with conc workers until ctx ends
// or noopMax requests, and checks each answer names the expected cell. rec
// gets every outcome; each worker records into its own stripe of recs.
//
// It is the bench's cheapest request loop, because it measures the ceiling
// the other runs are compared with: each worker builds its request once and
// changes only the path and the stamp (deadline and signature) per call,
// compares the answer with the one expected byte for byte instead of decoding
// it, and records into a striped recorder.
func (l noopLoad) run(ctx context.Context, conc int, recs []*opRecorder) {
	want, _ := json.Marshal(api.NoopResponse{Cell: l.cell})
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range conc {
		rec := recs[w%len(recs)]
		wg.Go(func() {
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.Header.SetMethod(http.MethodPost)
			if l.c.apiKey != "" {
				req.Header.Set(fasthttp.HeaderAuthorization, "Bearer "+l.c.apiKey)
			}
			if l.stress {
				req.Header.Set(api.HeaderStress, "1")
			}
			uri := make([]byte, 0, len(l.c.base)+len(api.NoopPath)+64)
			for ctx.Err() == nil {
				k := next.Add(1) - 1
				if k >= noopMax {
					return
				}
				uri = append(append(append(uri[:0], l.c.base...), api.NoopPath...), l.acts[k%int64(len(l.acts))]...)
				req.SetRequestURIBytes(uri)
				rec.record(l.one(req, resp, want), false)
			}
		})
	}
	wg.Wait()
}

// one sends req once and returns its outcome.
func (l noopLoad) one(req *fasthttp.Request, resp *fasthttp.Response, want []byte) result {
	sent := time.Now()
	deadline := sent.Add(requestTimeout)
	signer := l.c.signer
	if !l.stress {
		signer = nil // an ordinary client's request: no signature headers to send or check
	}
	cellclient.Stamp(req, signer, deadline, sent)
	err := l.c.hc.DoDeadline(req, resp, deadline)
	r := result{latency: time.Since(sent)}
	switch {
	case err != nil:
		r.code, r.message = codeTransport, err.Error()
		if cellclient.Transport(err) == model.ErrTimeout {
			r.code = codeClientTimeout
		}
	case resp.StatusCode() != fasthttp.StatusOK:
		e := cellclient.AnswerError(l.c.base, resp)
		r.code, r.message = e.Code, e.Message
		if r.code == "" {
			r.code = fmt.Sprintf("HTTP_%d", e.Status)
		}
	case !bytes.Equal(resp.Body(), want):
		var out api.NoopResponse
		if json.Unmarshal(resp.Body(), &out) != nil || out.Cell != l.cell {
			r.code, r.message = codeBadResponse, fmt.Sprintf("answered %q, want %q", resp.Body(), want)
		}
	}
	return r
}

// newStripes returns n fresh recorders.
func newStripes(n int) []*opRecorder {
	recs := make([]*opRecorder, n)
	for i := range recs {
		recs[i] = newOpRecorder()
	}
	return recs
}

// mergedStats sums the recorders' counts and merges their histograms.
func mergedStats(recs []*opRecorder) OpStats {
	all := newOpRecorder()
	for _, r := range recs {
		r.mu.Lock()
		all.count += r.count
		all.ok += r.ok
		all.repeats += r.repeats
		for c, n := range r.errors {
			all.errors[c] += n
		}
		all.hist.Merge(r.hist)
		r.mu.Unlock()
	}
	return all.stats()
}

// stripesOK and stripesErrors are the progress line's counts.
func stripesOK(recs []*opRecorder) (n int64) {
	for _, r := range recs {
		n += r.okCount()
	}
	return n
}

func stripesErrors(recs []*opRecorder) (n int64) {
	for _, r := range recs {
		n += r.errorCount()
	}
	return n
}
