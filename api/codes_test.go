package api

import (
	"errors"
	"testing"

	"github.com/valyala/fasthttp"

	"redcell/model"
)

// TestWriteError: every code is written with its status, its envelope and
// HeaderCode; an error without a code is INTERNAL, its text kept inside.
func TestWriteError(t *testing.T) {
	for _, code := range Codes() {
		var rc fasthttp.RequestCtx
		WriteError(&rc, model.Errorf(Sentinel(code), "m %s", code))
		want := `{"error":{"code":"` + code + `","message":"m ` + code + `"`
		if rc.Response.StatusCode() != Status(code) || string(ResponseCode(&rc.Response.Header)) != code ||
			string(rc.Response.Body()[:len(want)]) != want || string(rc.Response.Header.ContentType()) != "application/json" {
			t.Errorf("%s: %d %q %s", code, rc.Response.StatusCode(), ResponseCode(&rc.Response.Header), rc.Response.Body())
		}
	}
	var rc fasthttp.RequestCtx
	WriteError(&rc, errors.New("disk on fire"))
	if rc.Response.StatusCode() != 500 || string(ResponseCode(&rc.Response.Header)) != "INTERNAL" ||
		string(rc.Response.Body()) != `{"error":{"code":"INTERNAL","message":"internal error","retryable":true}}` {
		t.Errorf("uncoded error: %d %s", rc.Response.StatusCode(), rc.Response.Body())
	}
	var admin fasthttp.RequestCtx
	WriteErrorStatus(&admin, 403, &model.Error{Code: "ADMIN_DISABLED", Message: "no token"})
	if admin.Response.StatusCode() != 403 || string(ResponseCode(&admin.Response.Header)) != "ADMIN_DISABLED" {
		t.Errorf("admin error: %d %q", admin.Response.StatusCode(), ResponseCode(&admin.Response.Header))
	}
	if Sentinel("TEAPOT") != nil || Sentinel("SOLD_OUT") != model.ErrSoldOut {
		t.Error("Sentinel")
	}
}
