package testenv

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy forwards a loopback port to a target (the test memcached or MariaDB).
// Stop closes the port and every connection through it, as a server that
// stops would: a client's pooled connections read EOF and new ones are
// refused. Start serves the same port again. Safe for concurrent use.
type Proxy struct {
	target string

	mu      sync.Mutex // guards addr, ln, conns, cleanup
	addr    string
	ln      net.Listener
	conns   map[net.Conn]bool // both ends of every live forwarded connection
	cleanup bool              // t.Cleanup(p.Stop) registered
}

// NewProxy returns a stopped proxy to target; Start picks its port.
func NewProxy(target string) *Proxy {
	return &Proxy{target: target, addr: "127.0.0.1:0"}
}

// Addr returns the proxy's address (host:port) once it has started.
func (p *Proxy) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

// Start listens (on a free port the first time, the same port after a Stop)
// and forwards each accepted connection to the target. The first Start
// registers Stop with t.Cleanup, so what the test started after it (a cell
// using the proxy) stops first.
func (p *Proxy) Start(t testing.TB) {
	t.Helper()
	ln, err := net.Listen("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.ln, p.addr, p.conns = ln, ln.Addr().String(), map[net.Conn]bool{}
	first := !p.cleanup
	p.cleanup = true
	p.mu.Unlock()
	if first {
		t.Cleanup(p.Stop)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			if p.ln != ln { // stopped meanwhile
				p.mu.Unlock()
				c.Close()
				u.Close()
				continue
			}
			p.conns[c], p.conns[u] = true, true
			p.mu.Unlock()
			go p.pipe(u, c)
			go p.pipe(c, u)
		}
	}()
}

func (p *Proxy) pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// Conns returns how many client connections the proxy forwards now.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns) / 2
}

// Stop closes the port and every connection; Start opens it again. Stopping
// a stopped proxy does nothing.
func (p *Proxy) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]bool{}
}
