package executor

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Label values of the metrics besides tool names and error codes.
const (
	outcomeOK   = "ok"       // code label of a successful call
	unknownTool = "_unknown" // tool label of a call to a tool not in the registry
)

type metrics struct {
	calls     *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	inFlight  prometheus.Gauge
	abandoned prometheus.Counter

	cache        *prometheus.CounterVec // tool, result: hit, miss, store_failed
	rateLimited  *prometheus.CounterVec // tool
	truncated    *prometheus.CounterVec // tool
	circuit      *prometheus.GaugeVec   // tool: 0 closed, 1 half-open, 2 open
	circuitFast  *prometheus.CounterVec // tool: calls refused by an open circuit
	writeReplays *prometheus.CounterVec // tool, outcome: recorded, unknown
}

// newMetrics registers the executor's metrics on reg. Several executors may
// share one registry (toolwire dev, tests): they then share the collectors.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "toolwire", Subsystem: "executor", Name: "tool_calls_total",
			Help: "Tool calls executed, by tool name and outcome (ok or the envelope's error code).",
		}, []string{"tool", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "toolwire", Subsystem: "executor", Name: "tool_call_duration_seconds",
			Help:    "Wall time of tool calls (t_end - t_start of the envelope), by tool name.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10), // 1ms to ~4m
		}, []string{"tool"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "toolwire", Subsystem: "executor", Name: "tool_calls_in_flight",
			Help: "Tool calls being executed by this process.",
		}),
		abandoned: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "toolwire", Subsystem: "executor", Name: "tools_abandoned_total",
			Help: "Tools that did not return after their context ended and were left running.",
		}),
	}
	m.cache = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "toolwire", Subsystem: "executor", Name: "cache_lookups_total",
		Help: "Cache lookups of cacheable tools, by tool name and result (hit, miss).",
	}, []string{"tool", "result"})
	m.rateLimited = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "toolwire", Subsystem: "executor", Name: "rate_limited_total",
		Help: "Calls refused with RATE_LIMIT because the tenant's token bucket for the tool was empty, by tool name.",
	}, []string{"tool"})
	m.truncated = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "toolwire", Subsystem: "executor", Name: "outputs_truncated_total",
		Help: "Outputs larger than max_output_bytes (or than one message) stored as blobs, by tool name.",
	}, []string{"tool"})
	m.circuit = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "toolwire", Subsystem: "executor", Name: "circuit_state",
		Help: "State of each tool version's circuit in this replica: 0 closed, 1 half-open, 2 open.",
	}, []string{"tool"})
	m.circuitFast = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "toolwire", Subsystem: "executor", Name: "circuit_rejections_total",
		Help: "Calls answered PROVIDER_ERROR at once because the tool's circuit was open, by tool name@version.",
	}, []string{"tool"})
	m.writeReplays = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "toolwire", Subsystem: "executor", Name: "write_redeliveries_total",
		Help: "Redelivered calls of writes tools answered from their outcome record without running them, by tool name and outcome (recorded, unknown).",
	}, []string{"tool", "outcome"})
	if reg == nil {
		return m, nil
	}
	var err error
	m.calls, err = register(reg, m.calls)
	if err != nil {
		return nil, err
	}
	m.duration, err = register(reg, m.duration)
	if err != nil {
		return nil, err
	}
	m.inFlight, err = register(reg, m.inFlight)
	if err != nil {
		return nil, err
	}
	m.abandoned, err = register(reg, m.abandoned)
	if err != nil {
		return nil, err
	}
	for _, c := range []**prometheus.CounterVec{&m.cache, &m.rateLimited, &m.truncated, &m.circuitFast, &m.writeReplays} {
		if *c, err = register(reg, *c); err != nil {
			return nil, err
		}
	}
	if m.circuit, err = register(reg, m.circuit); err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c, or returns the identical collector already registered.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	var zero C
	return zero, fmt.Errorf("register executor metrics: %w", err)
}
