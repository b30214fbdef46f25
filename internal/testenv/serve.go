package testenv

import (
	"net"
	"testing"
)

// Server is what Serve runs: a *fasthttp.Server fits (net/http's Shutdown
// takes a context, so its Server does not). testenv names no HTTP library.
type Server interface {
	Serve(ln net.Listener) error
	Shutdown() error
}

// Serve runs srv on a free loopback port until the test ends (then shuts it
// down) and returns its host:port.
func Serve(t testing.TB, srv Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }() // returns when Shutdown closes ln
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String()
}
