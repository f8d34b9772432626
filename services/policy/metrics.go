package policy

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Kinds of check, the "kind" label of the metrics.
const (
	kindIteration = "iteration"
	kindCall      = "call"
)

// metrics counts the guard's verdicts.
type metrics struct {
	verdicts  *prometheus.CounterVec // kind, outcome
	denials   *prometheus.CounterVec // kind, rule
	approvals *prometheus.CounterVec // outcome
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		verdicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "toolwire", Subsystem: "policy", Name: "verdicts_total",
			Help: "Verdicts published by the Policy Guard, by kind of check (iteration, call) and outcome (approved, denied).",
		}, []string{"kind", "outcome"}),
		denials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "toolwire", Subsystem: "policy", Name: "denials_total",
			Help: "Denials published by the Policy Guard, by kind of check and the rule that denied.",
		}, []string{"kind", "rule"}),
		approvals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "toolwire", Subsystem: "policy", Name: "approvals_total",
			Help: "Tool call approvals by outcome: requested, approved, denied, revised, expired (no decision in time), ignored (a decision for a call that awaited none).",
		}, []string{"outcome"}),
	}
	// Export every verdict series from the start, so that rates work at once.
	for _, k := range []string{kindIteration, kindCall} {
		for _, o := range []string{"approved", "denied"} {
			m.verdicts.WithLabelValues(k, o)
		}
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.verdicts, m.denials, m.approvals} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("policy: register metrics: %w", err)
	}
	return m, nil
}

// observe counts one published verdict.
func (m *metrics) observe(kind string, dec Decision) {
	m.verdicts.WithLabelValues(kind, dec.Outcome()).Inc()
	if !dec.Allowed {
		m.denials.WithLabelValues(kind, dec.Rule).Inc()
	}
}
