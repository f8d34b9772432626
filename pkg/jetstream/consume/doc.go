// Package consume runs the services' durable consumers: a Runner pulls a
// stream's messages, hands each decoded event to a handler with back-pressure
// and keep-alives, retries infrastructure failures in place (Transient,
// IsTransient) without using up a message's delivery budget, retries a
// handler's own failures with back-off, and dead-letters a message that keeps
// failing (or is Permanent) with its failure history, which ListDeadLetters,
// GetDeadLetter and ReplayDeadLetter read and replay. Lag reports how far a
// consumer is behind.
package consume
