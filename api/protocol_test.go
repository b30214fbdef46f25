package api

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/valyala/fasthttp"

	"redcell/internal/testenv"
)

type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

// TestOversizedBodyIs413NotReset: a client that sends a body above the limit,
// with a Content-Length or chunked, reads a 413 BODY_TOO_LARGE JSON answer
// instead of a connection reset, every time. Without the drain most of these
// failed with "connection reset by peer" while the client was still writing.
func TestOversizedBodyIs413NotReset(t *testing.T) {
	const limit = 64 << 10
	addr := testenv.Serve(t, &fasthttp.Server{
		Handler:            func(rc *fasthttp.RequestCtx) { t.Errorf("handler reached with %d bytes", len(rc.PostBody())) },
		MaxRequestBodySize: limit,
		ErrorHandler:       ProtocolError,
		Logger:             quietLogger{},
	})
	url := "http://" + addr + "/v1/packets"
	client := &http.Client{}
	for _, size := range []int{limit + 1, 4 << 20} {
		for _, chunked := range []bool{false, true} {
			for i := range 5 {
				var body io.Reader = bytes.NewReader(bytes.Repeat([]byte("x"), size))
				if chunked {
					body = io.MultiReader(body) // no known length: sent chunked
				}
				resp, err := client.Post(url, "application/json", body)
				if err != nil {
					t.Fatalf("%d bytes (chunked %v), try %d: %v", size, chunked, i, err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				var e ErrorBody
				if resp.StatusCode != http.StatusRequestEntityTooLarge || json.Unmarshal(b, &e) != nil || e.Error.Code != "BODY_TOO_LARGE" || e.Error.Message == "" {
					t.Fatalf("%d bytes (chunked %v): %d %s", size, chunked, resp.StatusCode, b)
				}
			}
		}
	}
}
