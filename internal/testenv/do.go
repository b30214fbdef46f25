package testenv

import (
	"io"
	"net/http"
	"testing"
)

// Do sends req with c (nil: http.DefaultClient) and returns the answer and
// its body, read whole (the body is closed). A transport error or a failed
// read fails the test, naming the request: a test that wants to see those
// sends the request itself.
func Do(t testing.TB, c *http.Client, req *http.Request) (*http.Response, []byte) {
	t.Helper()
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v (want an answer, not a transport error)", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", req.Method, req.URL, err)
	}
	return resp, b
}

// Get is Do of a GET of url with http.DefaultClient: the answer's status and
// body.
func Get(t testing.TB, url string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	resp, b := Do(t, nil, req)
	return resp.StatusCode, b
}
