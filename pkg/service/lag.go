package service

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolwire/toolwire/pkg/jetstream/consume"
)

// lagAsk bounds how long a scrape waits for the server's answer about the
// lag of a service's consumers; lagFresh is how long an answer serves the
// scrapes that follow it (several Prometheus replicas, a dashboard).
const (
	lagAsk   = 2 * time.Second
	lagFresh = time.Second
)

// lagCollector reports the lag of the consumers a service's runners consume,
// asked of the server when scraped: one request per consumer, however many
// replicas of the service share the durable (they see the same numbers).
type lagCollector struct {
	pending, ackPending, redelivered *prometheus.Desc

	mu      sync.Mutex
	runners map[*consume.Runner]struct{}
	at      time.Time // of lags
	lags    []consume.Lag
}

func newLagCollector(m *Metrics) *lagCollector {
	labels := []string{"stream", "consumer"}
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(m.doc(name, "gauge", help, labels), help, labels, nil)
	}
	return &lagCollector{
		pending: desc("consumer_pending",
			"Events of a consumer's subjects not yet delivered to it (its backlog; what an autoscaler watches), by stream and consumer, as the server counts them when scraped."),
		ackPending: desc("consumer_ack_pending",
			"Events delivered to a consumer and not yet acknowledged (in its handlers, or held by a replica that died until their ack wait), by stream and consumer."),
		redelivered: desc("consumer_redelivered",
			"Events delivered to a consumer more than once and not yet acknowledged, by stream and consumer."),
		runners: map[*consume.Runner]struct{}{},
	}
}

func (c *lagCollector) track(r *consume.Runner) {
	c.mu.Lock()
	c.runners[r] = struct{}{}
	c.mu.Unlock()
}

func (c *lagCollector) untrack(r *consume.Runner) {
	c.mu.Lock()
	delete(c.runners, r)
	c.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (c *lagCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pending
	ch <- c.ackPending
	ch <- c.redelivered
}

// Collect implements prometheus.Collector. A consumer the server does not
// answer for within lagAsk is left out of this scrape (its series goes
// stale), rather than reported as caught up.
func (c *lagCollector) Collect(ch chan<- prometheus.Metric) {
	for _, l := range c.current() {
		for _, m := range []struct {
			d *prometheus.Desc
			v uint64
		}{{c.pending, l.Pending}, {c.ackPending, l.AckPending}, {c.redelivered, l.Redelivered}} {
			ch <- prometheus.MustNewConstMetric(m.d, prometheus.GaugeValue, float64(m.v), l.Stream, l.Consumer)
		}
	}
}

// current returns the lags, asked again when older than lagFresh.
func (c *lagCollector) current() []consume.Lag {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.at) < lagFresh {
		return slices.Clone(c.lags)
	}
	// A scrape carries no context: this is where its requests start.
	ctx, cancel := context.WithTimeout(context.Background(), lagAsk)
	defer cancel()
	seen := map[[2]string]bool{}
	c.lags = c.lags[:0]
	for r := range c.runners {
		l, err := r.Lag(ctx)
		key := [2]string{l.Stream, l.Consumer}
		if err != nil || seen[key] {
			continue
		}
		seen[key] = true
		c.lags = append(c.lags, l)
	}
	c.at = time.Now()
	return slices.Clone(c.lags)
}
