// Package servicetest holds the checks every service's tests run against the
// shared skeleton of package service.
package servicetest

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolwire/toolwire/pkg/service"
)

// VarsTakeEffect checks a service's documented environment variables against
// its ConfigFromEnv: every variable has help text and an example, the example
// is accepted, and it changes the configuration (a variable that is read but
// changes nothing is as good as undocumented). Each is tried alone.
func VarsTakeEffect[C any](t *testing.T, vars []service.Var, fromEnv func(getenv func(string) string) (C, error)) {
	t.Helper()
	base, err := fromEnv(func(string) string { return "" })
	if err != nil {
		t.Fatalf("the empty environment is refused: %v", err)
	}
	seen := map[string]bool{}
	for _, v := range vars {
		if v.Name == "" || v.Help == "" || v.Example == "" {
			t.Errorf("variable %+v: name, help and example are required", v)
			continue
		}
		if seen[v.Name] {
			t.Errorf("variable %s is listed twice", v.Name)
		}
		seen[v.Name] = true
		got, err := fromEnv(func(k string) string {
			if k == v.Name {
				return v.Example
			}
			return ""
		})
		if err != nil {
			t.Errorf("%s=%q (its documented example) is refused: %v", v.Name, v.Example, err)
			continue
		}
		if reflect.DeepEqual(base, got) {
			t.Errorf("%s=%q changes nothing in the configuration", v.Name, v.Example)
		}
	}
}

// FreeAddr is a loopback address whose port was free a moment ago, for a
// service's TOOLWIRE_HTTP_ADDR when the test must know it in advance. The
// port is drawn below Linux's ephemeral range (32768-60999): a port the
// kernel handed out for ":0" is handed out again as the local port of some
// outbound connection soon after it is closed, which then holds it when the
// service binds (seen as "address already in use" beside other tests).
func FreeAddr(t testing.TB) string {
	t.Helper()
	for range 100 {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePortLow+rand.IntN(freePortSpan)))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue // taken: draw again
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		return addr
	}
	t.Fatalf("no free loopback port in %d-%d after 100 draws", freePortLow, freePortLow+freePortSpan-1)
	return ""
}

// The ports FreeAddr draws from: below the ephemeral range, above the
// registered services most machines run.
const (
	freePortLow  = 20000
	freePortSpan = 12000
)

// Getenv reads the environment from env, as a binary's os.Getenv would.
func Getenv(env map[string]string) func(string) string {
	return func(k string) string { return env[k] }
}

// Run runs a service as its binary's main does, service.Run(name,
// defaultHTTPAddr) with build on the environment env, in the background.
// stop cancels it and returns what Run returned; the test fails if Run has
// not returned 30s after. The test's end cancels it too.
func Run(t testing.TB, name, defaultHTTPAddr string, env map[string]string, build service.Build) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- service.Run(ctx, name, defaultHTTPAddr, Getenv(env), build) }()
	return func() error {
		t.Helper()
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: Run did not return 30s after its context ended", name)
			return nil
		}
	}
}

// Output collects what services or processes write (a logger's handler, a
// command's stdout and stderr) for a test to read while they still write.
type Output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

// String is everything written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// CounterSum sums the counter series of the metric name in g whose labels
// have every value of labels (a label not named there may have any value).
func CounterSum(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather the metrics: %v", err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			matched := 0
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v == l.GetValue() {
					matched++
				}
			}
			if matched == len(labels) {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// PollUntil polls cond on the test's goroutine (so that cond may use
// require) until it holds, or fails the test after limit, saying what it
// waited for.
func PollUntil(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("not within %s: %s", limit, what)
		case <-tick.C:
		}
	}
}
