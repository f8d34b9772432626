package executor

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolwire/toolwire/pkg/service"
)

// Label values of the metrics besides tool labels and error codes. Every
// metric's tool label is service.ToolLabel: name@version.
const (
	outcomeOK   = "ok"       // code label of a successful call
	unknownTool = "_unknown" // tool label of a call to a tool not in the registry

	// Stages of a call its run's cancellation stopped (cancel.go).
	cancelRefused = "refused" // not started: POLICY_DENIED
	cancelCut     = "cut"     // stopped while it ran: TIMEOUT
)

type metrics struct {
	// consumers counts what the service\'s consumers go through (failures,
	// redeliveries, dead letters).
	consumers *service.ConsumerMetrics

	calls     *prometheus.CounterVec   // tool, code
	duration  *prometheus.HistogramVec // tool
	inFlight  prometheus.Gauge
	abandoned prometheus.Counter

	cache        *prometheus.CounterVec // tool, result: hit, miss
	rateLimited  *prometheus.CounterVec // tool
	truncated    *prometheus.CounterVec // tool
	circuit      *prometheus.GaugeVec   // tool: 0 closed, 1 half-open, 2 open
	circuitFast  *prometheus.CounterVec // tool: calls refused by an open circuit
	writeReplays *prometheus.CounterVec // tool, outcome: recorded, unknown, retried

	heartbeatFailures prometheus.Counter

	sandboxJobFailures *prometheus.CounterVec // tool
	sandboxJobResends  *prometheus.CounterVec // tool
	// runOver counts calls dropped unstarted because their run is over.
	runOver *prometheus.CounterVec // tool, reason: deadline, ended
	// cancelled counts calls stopped by their run's cancellation.
	cancelled *prometheus.CounterVec // tool, stage: refused, cut
	// cancelsInvalid counts cancel requests dropped as malformed.
	cancelsInvalid prometheus.Counter
}

// newMetrics registers the executor's metrics on reg. Several executors may
// share one registry (toolwire dev, tests): they then share the collectors.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	return service.RegisterMetrics(reg, "executor", func(r *service.Metrics, consumers *service.ConsumerMetrics) *metrics {
		return &metrics{
			consumers: consumers,
			calls: r.CounterVec("tool_calls_total",
				"Tool calls executed, by tool name@version and outcome (ok or the envelope's error code).", "tool", "code"),
			duration: r.HistogramVec("tool_call_duration_seconds",
				"Wall time of tool calls (t_end - t_start of the envelope), by tool name@version.",
				prometheus.ExponentialBuckets(0.001, 4, 10), // 1ms to ~4m
				"tool"),
			inFlight: r.Gauge("tool_calls_in_flight", "Tool calls being executed by this process."),
			abandoned: r.Counter("tools_abandoned_total",
				"Tools that did not return after their context ended and were left running."),
			cache: r.CounterVec("cache_lookups_total",
				"Cache lookups of cacheable tools, by tool name@version and result (hit, miss).", "tool", "result"),
			rateLimited: r.CounterVec("rate_limited_total",
				"Calls refused with RATE_LIMIT because the tenant's token bucket for the tool was empty, by tool name@version.", "tool"),
			truncated: r.CounterVec("outputs_truncated_total",
				"Outputs larger than max_output_bytes (or than one message) stored as blobs, by tool name@version.", "tool"),
			circuit: r.GaugeVec("circuit_state",
				"State of each tool version's circuit in this replica: 0 closed, 1 half-open, 2 open, by tool name@version.", "tool"),
			circuitFast: r.CounterVec("circuit_rejections_total",
				"Calls answered PROVIDER_ERROR at once because the tool's circuit was open, by tool name@version.", "tool"),
			writeReplays: r.CounterVec("write_redeliveries_total",
				"Redelivered calls of writes tools that found their outcome record: answered from it without running the tool (recorded; unknown: its executor stopped during the call), or run again because the tool declares idempotent retries (retried), by tool name@version and outcome.", "tool", "outcome"),
			heartbeatFailures: r.Counter("heartbeat_failures_total",
				"Heartbeats of the queues this process serves that could not be published (three in a row: the queues count as unserved)."),
			sandboxJobFailures: r.CounterVec("sandbox_job_publish_failures_total",
				"Sandbox jobs that could not be sent (their publish failed after its retries, or a job not found stored could not be sent again before its call ended), by tool name@version.", "tool"),
			sandboxJobResends: r.CounterVec("sandbox_job_resends_total",
				"Sandbox jobs sent again because their call, with no answer yet, did not find them stored (a publish lost around a leader change), by tool name@version.", "tool"),
			runOver: r.CounterVec("calls_of_ended_runs_total",
				"Calls dropped without being started because their run was over: past its deadline (reason deadline) or ended (reason ended), by tool name@version.", "tool", "reason"),
			cancelled: r.CounterVec("calls_cancelled_total",
				"Calls stopped because their run was cancelled: refused before they started (stage refused, POLICY_DENIED) or cut short while they ran (stage cut, TIMEOUT), by tool name@version and stage.", "tool", "stage"),
			cancelsInvalid: r.Counter("cancel_requests_invalid_total",
				"Cancel requests dropped because they could not be decoded or are not valid."),
		}
	})
}
