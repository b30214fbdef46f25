package testenv

import (
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
)

var (
	portsMu sync.Mutex // guards portsGiven
	// portsGiven holds every port FreePorts has handed out in this process, so
	// two calls (parallel tests, a cell moved to new ports) never share one
	// before its owner binds it.
	portsGiven = map[int]bool{}
)

// FreePorts returns n distinct loopback ports, each free for TCP and UDP
// (memberlist binds both). They are drawn from 20000-32767, below Linux's
// ephemeral range, so outgoing connections made while a cluster starts
// (MariaDB clients, gossip dials) cannot take one first, and none is handed
// out twice in one test process. Safe for concurrent use.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 2000 {
			t.Fatal("testenv: no free ports")
		}
		port := 20000 + rand.IntN(12768)
		if portsGiven[port] {
			continue
		}
		portsGiven[port] = true
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
		ln.Close()
		if err != nil {
			continue
		}
		u.Close()
		ports = append(ports, port)
	}
	return ports
}
