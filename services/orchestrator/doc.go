// Package orchestrator runs the agent loop of toolwire: it takes run requests,
// asks the Policy Guard before every model call, calls the model through a
// provider adapter, publishes the model's tool calls (all calls of a turn at
// once, so they run in parallel), collects their envelopes, hands the results
// (errors included, as data) back to the model, and publishes the stable
// AgentOutputs when the model answers.
//
// The orchestrator keeps no run state in memory between events: the state of
// every run lives in a JetStream KV bucket and is changed only by
// compare-and-set on its revision. Each handler first makes its state change
// durable, then publishes the effects that follow from the new state, with
// deterministic event ids; a redelivered event finds the change already made
// and publishes the same effects again, which JetStream drops as duplicates.
package orchestrator
