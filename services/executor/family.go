package executor

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// The executor's core runs the call pipeline (registry, schemas, secrets,
// cache, rate limits, circuits, outcomes, truncation) on the tools it is
// given: Config.Tools, and the tools and kinds of Config.Families. It links
// no tool family itself, so that a worker program (package worker), which
// runs only its own Go tools, links none of theirs. Package standard
// assembles the families of the executor binary: the built-ins, the web
// tools, and the http, mcp and sandbox kinds.

// Kind runs the registry entries of one implementation kind (http, mcp,
// sandbox): Tool returns the tool that runs the entry def, or the error
// envelope that says why it cannot run.
type Kind interface {
	Tool(def *envelope.ToolDefinition) (toolapi.Tool, *envelope.ToolError)
}

// Host is what an executor lends the Families it opens.
type Host struct {
	JS  jetstream.JetStream
	Pub *publish.Publisher // publishes as the executor
	// Source is the CloudEvents source of the executor's events
	// (Config.Source).
	Source string
	Log    *slog.Logger
	// SandboxJobs are the executor's counters of the sandbox jobs its
	// families send (package tools/sandboxtool).
	SandboxJobs JobCounters
}

// JobCounters count, by tool name@version, the sandbox jobs that could not
// be sent and those sent again because they were not found stored.
type JobCounters struct {
	PublishFailures *prometheus.CounterVec
	Resends         *prometheus.CounterVec
}

// Family is a set of tools and kinds an executor runs beside Config.Tools.
// New opens each family of Config.Families once; a Family is a
// configuration, and may be opened by several executors.
type Family interface {
	Open(h Host) (Opened, error)
}

// Opened is what an opened Family gives its executor.
type Opened struct {
	// Tools are in-process tools, keyed by their builtin keys like
	// Config.Tools; their definitions are ensured in the registry at Start.
	Tools []toolapi.Tool
	// Kinds run the registry entries of their implementation kinds.
	Kinds map[envelope.ImplementationKind]Kind
	// Start, when set, is called by the executor's Start: life ends at Stop.
	Start func(life context.Context) error
	// Close, when set, is called at Stop once no call is in flight, or when
	// a Start that called Start fails.
	Close func()
}
