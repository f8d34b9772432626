package service

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolwire/toolwire/pkg/jetstream/consume"
)

// Metric naming, one scheme for every service (docs/operations.md, Metrics):
//
//   - toolwire_<service>_<what>[_<unit>], lower snake case;
//   - counters end in _total; durations are histograms in _seconds;
//     sizes are in _bytes;
//   - a tool is labelled tool="<name>@<version>" (ToolLabel), everywhere.
//
// Metrics registers a service's collectors under that scheme and refuses
// names that break it.
type Metrics struct {
	reg    prometheus.Registerer
	prefix string
	errs   []error
}

var metricName = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// NewMetrics registers on reg (nil: the collectors are made but registered
// nowhere) with names toolwire_<service>_....
func NewMetrics(reg prometheus.Registerer, service string) *Metrics {
	return &Metrics{reg: reg, prefix: "toolwire_" + service + "_"}
}

// RegisterMetrics registers a service's collectors: build makes them on a
// Metrics named toolwire_<service>_..., beside the consumer metrics every
// service's runners report to. A name that breaks the scheme, or a collector
// that cannot be registered, is an error. Replicas sharing a registry (toolwire
// dev, tests) share the collectors.
func RegisterMetrics[M any](reg prometheus.Registerer, service string, build func(r *Metrics, consumers *ConsumerMetrics) M) (M, error) {
	r := NewMetrics(reg, service)
	m := build(r, NewConsumerMetrics(r))
	if err := r.Err(); err != nil {
		var zero M
		return zero, fmt.Errorf("%s: %w", service, err)
	}
	return m, nil
}

// ToolLabel is the value of the tool label: name@version.
func ToolLabel(name, version string) string {
	if version == "" {
		return name
	}
	return name + "@" + version
}

// Err returns every registration problem, joined, or nil.
func (m *Metrics) Err() error { return errors.Join(m.errs...) }

func (m *Metrics) name(name, kind string) string {
	full := m.prefix + name
	switch {
	case !metricName.MatchString(name):
		m.errs = append(m.errs, fmt.Errorf("metric %s: want lower snake case", full))
	case kind == "counter" && !strings.HasSuffix(name, "_total"):
		m.errs = append(m.errs, fmt.Errorf("metric %s: a counter's name ends in _total", full))
	case kind != "counter" && strings.HasSuffix(name, "_total"):
		m.errs = append(m.errs, fmt.Errorf("metric %s: only counters end in _total", full))
	}
	return full
}

// MetricDoc describes one metric a service registers.
type MetricDoc struct {
	Name, Kind, Help string
	Labels           []string
}

// Documenter hears of every metric registered through a Metrics whose
// registerer is one (the metrics table of docs/operations.md is made this
// way, from the services themselves).
type Documenter interface{ Document(MetricDoc) }

// doc names a metric after the scheme and tells a Documenter registerer.
func (m *Metrics) doc(name, kind, help string, labels []string) string {
	full := m.name(name, kind)
	if d, ok := m.reg.(Documenter); ok {
		d.Document(MetricDoc{Name: full, Kind: kind, Help: help, Labels: labels})
	}
	return full
}

// Counter registers a counter.
func (m *Metrics) Counter(name, help string) prometheus.Counter {
	return register(m, prometheus.NewCounter(prometheus.CounterOpts{Name: m.doc(name, "counter", help, nil), Help: help}))
}

// CounterVec registers a counter with labels.
func (m *Metrics) CounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return register(m, prometheus.NewCounterVec(prometheus.CounterOpts{Name: m.doc(name, "counter", help, labels), Help: help}, labels))
}

// Gauge registers a gauge.
func (m *Metrics) Gauge(name, help string) prometheus.Gauge {
	return register(m, prometheus.NewGauge(prometheus.GaugeOpts{Name: m.doc(name, "gauge", help, nil), Help: help}))
}

// GaugeVec registers a gauge with labels.
func (m *Metrics) GaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return register(m, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: m.doc(name, "gauge", help, labels), Help: help}, labels))
}

// Histogram registers a histogram; a duration's name ends in _seconds.
func (m *Metrics) Histogram(name, help string, buckets []float64) prometheus.Histogram {
	return register(m, prometheus.NewHistogram(prometheus.HistogramOpts{Name: m.doc(name, "histogram", help, nil), Help: help, Buckets: buckets}))
}

// HistogramVec registers a histogram with labels.
func (m *Metrics) HistogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return register(m, prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: m.doc(name, "histogram", help, labels), Help: help, Buckets: buckets}, labels))
}

// register registers c, or returns the identical collector already registered
// (several replicas of a service may share one registry: `toolwire dev`,
// tests).
func register[C prometheus.Collector](m *Metrics, c C) C {
	if m.reg == nil {
		return c
	}
	err := m.reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	m.errs = append(m.errs, fmt.Errorf("register metric: %w", err))
	return c
}

// ConsumerMetrics counts what a service's consumers go through, per stream
// and consumer: handler failures (and whether they were final),
// redeliveries, and dead letters by how they were stored; and the publishes
// of the service's publisher that failed, by event type. Give it to the
// service's events.Runners (its Observer); Deps.Core gives it to the
// service's publisher too (its publish.Observer).
type ConsumerMetrics struct {
	failures        *prometheus.CounterVec
	redeliveries    *prometheus.CounterVec
	deadLetters     *prometheus.CounterVec
	lag             *lagCollector
	infraRetries    *prometheus.CounterVec
	publishFailures *prometheus.CounterVec
}

// NewConsumerMetrics registers the consumer metrics of a service on m.
func NewConsumerMetrics(m *Metrics) *ConsumerMetrics {
	return &ConsumerMetrics{
		failures: m.CounterVec("handler_failures_total",
			"Events whose handler failed, by stream, consumer and whether the failure was final (dead-lettered) or will be retried.",
			"stream", "consumer", "final"),
		redeliveries: m.CounterVec("redeliveries_total",
			"Events delivered again after a failed or unacknowledged attempt, by stream and consumer.", "stream", "consumer"),
		deadLetters: m.CounterVec("dead_letters_total",
			"Events moved to the dead-letter stream, by stream, consumer and how they were stored (inline; object: too large for a message; truncated: too large and the object store failed).",
			"stream", "consumer", "stored"),
		lag: register(m, newLagCollector(m)),
		infraRetries: m.CounterVec("infrastructure_retries_total",
			"Handler calls retried in place because NATS or JetStream did not answer (no delivery budget used), by stream and consumer.",
			"stream", "consumer"),
		publishFailures: m.CounterVec("publish_failures_total",
			"Publishes that failed, by event type: the event was not confirmed stored (no PubAck, an error, the deadline) and the call said so, or its unwaited PublishAsync was collected unstored; each is logged with its subject and event id. A caller that retries counts each failed attempt.",
			"type"),
	}
}

// PublishFailed counts a failed publish (publish.Observer).
func (c *ConsumerMetrics) PublishFailed(eventType string) {
	if c == nil {
		return
	}
	c.publishFailures.WithLabelValues(eventType).Inc()
}

// Track follows a runner's lag (events.LagTracker): the runners of a group
// whose Observer is c are tracked as they start.
func (c *ConsumerMetrics) Track(r *consume.Runner) { c.lag.track(r) }

// Untrack stops following a stopped runner.
func (c *ConsumerMetrics) Untrack(r *consume.Runner) { c.lag.untrack(r) }

// TransientRetried counts a retry in place after an infrastructure failure.
func (c *ConsumerMetrics) TransientRetried(stream, consumer string) {
	c.infraRetries.WithLabelValues(stream, consumer).Inc()
}

// HandlerFailed counts a failure.
func (c *ConsumerMetrics) HandlerFailed(stream, consumer string, final bool) {
	c.failures.WithLabelValues(stream, consumer, strconv.FormatBool(final)).Inc()
}

// Redelivered counts a redelivery.
func (c *ConsumerMetrics) Redelivered(stream, consumer string) {
	c.redeliveries.WithLabelValues(stream, consumer).Inc()
}

// DeadLettered counts a dead letter.
func (c *ConsumerMetrics) DeadLettered(stream, consumer, how string) {
	c.deadLetters.WithLabelValues(stream, consumer, how).Inc()
}
