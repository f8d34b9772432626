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
// The state of every run (bounded: what the loop needs to decide, never the
// conversation or an envelope) lives in a JetStream KV bucket and is changed
// only by compare-and-set on its revision; the conversation is rebuilt from
// the run's events. No replica owns a run: any replica handles any of its
// events. Every publish has a deterministic event id, and a run's turns and
// end are published only onto an empty subject, so a redelivered event
// publishes exactly what is missing. Only the handler of the event that
// drives a model call (the state's Trigger: the request, or the envelope that
// answered a turn's last call) makes it. loop.go opens with the loop as a
// state machine: its phases, the events that move it, what is written when.
// Faults lets tests stop the loop at each step.
//
// What a replica keeps in memory between events is a cache, or a run request
// it holds unacknowledged, each safe to lose and safe beside other replicas:
//
//   - Run-state snapshots (stateStore, store.go): per run, the last state
//     this replica read or wrote and its revision, so that a write need not
//     read first. Dropped when this replica sees the run end, else when it
//     is idle once maxCachedRuns (4096) runs are cached. Every write is a
//     compare-and-set on the snapshot's revision, so a snapshot another
//     replica has outdated fails its write, and the change is applied again
//     to a fresh read; a decision not to write, taken on a snapshot, is
//     confirmed on a fresh read; and the one step taken on a snapshot before
//     any write (earlyTurn) is checked by the write that follows it.
//   - The stash (stateStore.stash): a new run's state, kept after its first
//     turn is in the stream and before the state is in KV, only while this
//     replica holds the run's request unacknowledged. It is created in KV by
//     the first change of the run that must be written, or before the
//     request is acknowledged (flush); a run that ends sooner need not be
//     written at all (writeStash says when it is). Losing it loses nothing
//     the stream lacks: another replica that gets an event of the run
//     meanwhile (an envelope of its first turn, or the request again after
//     this replica died) rebuilds the state from the first turn in the
//     stream (stateFromStream), and the stash gives way to the state it
//     then finds in KV.
//   - Conversations (conversations, history.go): per run, its request, the
//     messages of its turns and the envelopes this replica has seen, so that
//     a model call reads nothing back. At most maxConversations (1024) runs,
//     the least recently used dropped first; a run's is dropped when this
//     replica sees its end. They are copies of the run's events, which the
//     stream does not change once stored (a turn is the first one published
//     on its subject, and the loop takes the stored one when another
//     delivery's came first): a replica's copy may lack some, which it then
//     reads from the stream, but holds nothing the stream contradicts.
//   - Deadline timers (deadlines, reaper.go): for each run request this
//     replica handles, the timer that stores the run's deadline in the timer
//     stream when the run outlasts Config.TimerAfter, and the request, held
//     unacknowledged until the timer is stored or the run has ended. A crash
//     meanwhile redelivers the request, and the replica that takes it arms
//     the timer.
//
// The tool catalog (registry.Catalog) follows the registry's bucket by a
// watch; it holds no run state.
package orchestrator
