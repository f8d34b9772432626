// Package events is toolwire's wire contract: a typed CloudEvent for every
// subject of the pipeline (the event table, Table), the data types and JSON
// Schemas of their payloads, subject builders that refuse unsafe ids, the
// NATS protocol binding (binary content mode out, binary and structured in:
// Encode, Decode, Build and the New<Event> constructors), and the trace
// context each event carries so that one trace spans every service of a run.
//
// It is what an upstream system or a consumer of tool events imports; it does
// no I/O of its own. Publishing, consuming, provisioning and the state kept in
// JetStream are in the packages under pkg/jetstream (docs/development.md,
// Modules).
package events
