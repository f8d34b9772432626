// Package orchestrator runs the agent loop of toolwire: it takes run requests,
// asks the Policy Guard before every model call (iteration cap, budget), calls
// the model through a provider adapter (package provider: OpenAI Chat
// Completions and Anthropic Messages through their official SDKs, a scripted
// model, a replay of a recorded run), publishes the model's tool calls (all calls of a turn at
// once, so they run in parallel, each with the budget the guard needs),
// collects their envelopes, hands the results (errors included, as data) back
// to the model, and publishes the stable AgentOutputs, with the resolved
// pinned handles beside them, when the model answers. It prices every model
// turn and tool call, accrues the run's spend and publishes a usage event for
// each, and suspends a run while one of its calls waits for an approval.
//
// The orchestrator keeps no run state in memory between events: the state of
// every run lives in a JetStream KV bucket and is changed only by
// compare-and-set on its revision. Each handler first makes its state change
// durable, then publishes the effects of the event it handled, derived from
// the state, with deterministic event ids; a redelivered event finds the
// change already made and publishes the same effects again, which JetStream
// drops as duplicates. A model call is claimed in the run state before it is
// made, so that a second delivery of the same verdict does not call the model
// again while the first is alive. Faults lets tests stop the loop at each of
// these points.
package orchestrator
