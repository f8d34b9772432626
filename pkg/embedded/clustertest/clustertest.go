// Package clustertest runs a three-node JetStream cluster of in-process
// nats-servers on loopback for tests: this module's provisioning tests and
// the stack's failover tests start it the same way. A node can be killed and
// started again on the same ports and store. Only tests import it, so the
// server stays out of what upstream systems build.
package clustertest

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Cluster is three nodes, n1 to n3 (indexes 0 to 2), each tagged node:nX
// for placement. Its ports and stores are fixed when it is made; no node
// runs until Start.
type Cluster struct {
	t      testing.TB
	name   string
	client []int // client ports
	routes []int
	dirs   []string

	mu    sync.Mutex
	nodes []*server.Server
}

// New reserves the ports and stores of a cluster named name; t's end kills
// every node still running.
func New(t testing.TB, name string) *Cluster {
	t.Helper()
	ports := freePorts(t, 6)
	c := &Cluster{t: t, name: name, client: ports[:3], routes: ports[3:], nodes: make([]*server.Server, 3)}
	for range 3 {
		c.dirs = append(c.dirs, t.TempDir())
	}
	t.Cleanup(func() {
		for i := range 3 {
			c.Kill(i)
		}
	})
	return c
}

// Start starts the cluster's three nodes, in order.
func Start(t testing.TB, name string) *Cluster {
	t.Helper()
	c := New(t, name)
	for i := range 3 {
		c.StartNode(i)
	}
	return c
}

// StartNode starts node i (again, after Kill: same ports, same store) and
// waits until it takes connections.
func (c *Cluster) StartNode(i int) {
	c.t.Helper()
	var routes []*url.URL
	for j, p := range c.routes {
		if j != i {
			u, err := url.Parse("nats://127.0.0.1:" + strconv.Itoa(p))
			if err != nil {
				c.t.Fatal(err)
			}
			routes = append(routes, u)
		}
	}
	s, err := server.NewServer(&server.Options{
		ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: c.client[i], JetStream: true, StoreDir: c.dirs[i],
		NoSigs: true, NoLog: true, Tags: []string{fmt.Sprintf("node:n%d", i+1)},
		Cluster: server.ClusterOpts{Name: c.name, Host: "127.0.0.1", Port: c.routes[i]},
		Routes:  routes,
	})
	if err != nil {
		c.t.Fatalf("clustertest: node n%d: %v", i+1, err)
	}
	go s.Start()
	if !s.ReadyForConnections(20 * time.Second) {
		s.Shutdown()
		c.t.Fatalf("clustertest: node n%d not ready after 20s", i+1)
	}
	c.mu.Lock()
	c.nodes[i] = s
	c.mu.Unlock()
}

// Kill shuts node i down at once (its clients see the connection drop).
func (c *Cluster) Kill(i int) {
	c.mu.Lock()
	s := c.nodes[i]
	c.nodes[i] = nil
	c.mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// URL is node i's client URL.
func (c *Cluster) URL(i int) string { return "nats://127.0.0.1:" + strconv.Itoa(c.client[i]) }

// URLs is every node's client URL, comma-separated, as NATS_URL takes it.
func (c *Cluster) URLs() string {
	us := make([]string, 3)
	for i := range us {
		us[i] = c.URL(i)
	}
	return strings.Join(us, ",")
}

// freePorts returns n ports free on 127.0.0.1 a moment ago.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
		if err := ln.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return ports
}
