// Package events is toolwire's event spine: a typed CloudEvent for every subject
// of the pipeline, the NATS protocol binding (binary content mode out, binary and
// structured in), subject builders that refuse unsafe ids, idempotent
// provisioning of streams, consumers, KV buckets and the object store, a
// publisher whose event ids are the Nats-Msg-Id, a consumer runner with bounded
// retries and a dead-letter stream, and OpenTelemetry propagation so that one
// trace spans every service of a run.
package events
