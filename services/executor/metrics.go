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
