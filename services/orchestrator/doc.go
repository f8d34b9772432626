// Package orchestrator runs the agent loop of toolwire on contract v2: it takes
// run requests, checks the run-level loop rules before every model call (the
// iteration cap and the budget, from pkg/rules, the Policy Guard's own code),
// calls the model through a provider adapter (package provider: OpenAI Chat
// Completions and Anthropic Messages through their official SDKs, a scripted
// model, a replay of a recorded run), and publishes one turn event per model
// call with all of its tool calls, which the Policy Guard judges and the
// executors run in parallel. It collects the calls' envelopes, hands the
// results (errors included, as data) back to the model, and ends the run with
// the stable AgentOutputs, with the resolved pinned handles beside them, on its
// completed event when the model answers. A turn's model cost rides on the turn
// event, a tool call's cost on its envelope; a run waits, suspended, while one
// of its calls waits for an operator's approval.
//
// The orchestrator keeps no run state in memory between events: the state of
// every run (bounded: what the loop needs to decide, never the conversation
// or an envelope) lives in a JetStream KV bucket and is changed only by
// compare-and-set on its revision; the conversation is rebuilt from the run's
// events. Every publish has a deterministic event id, and a run's turns and
// end are published only onto an empty subject, so a redelivered event
// publishes exactly what is missing. Only the handler of the event that
// drives a model call (the state's Trigger: the request, or the envelope that
// answered a turn's last call) makes it. Faults lets tests stop the loop at
// each step.
package orchestrator
