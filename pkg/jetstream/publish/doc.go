// Package publish puts events on JetStream: each with its event id as the
// Nats-Msg-Id, so that a publish retried after a crash is dropped as a
// duplicate, confirmed by its PubAck (Publisher.Publish), only onto an empty
// subject (PublishFirst), or in batches whose acks are awaited together
// (PublishAsync, PublishAll). Stored tells whether an effect is durable.
// Every publish that fails is logged and heard by the Publisher's Observer
// (a service's metrics), a PublishAsync dropped unwaited included.
package publish
