package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestHealthcheck: 200 is healthy; another status, an unreachable address
// and a missing URL are not.
func TestHealthcheck(t *testing.T) {
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"status":"ok"}`)) }))
	defer ok.Close()
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"status":"db_unreachable"}`))
	}))
	defer down.Close()
	ctx := context.Background()
	if err := run(ctx, []string{"healthcheck", ok.URL + "/healthz"}); err != nil {
		t.Errorf("a 200 answer: %v", err)
	}
	if err := run(ctx, []string{"healthcheck", down.URL + "/healthz"}); err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("a 503 answer: %v", err)
	}
	closed := httptest.NewServer(http.NotFoundHandler())
	url := closed.URL
	closed.Close()
	if err := run(ctx, []string{"healthcheck", "--timeout", "500ms", url + "/healthz"}); err == nil {
		t.Error("a closed port was healthy")
	}
	if err := run(ctx, []string{"healthcheck"}); !errors.Is(err, errUsage) {
		t.Errorf("no URL: %v", err)
	}
}
