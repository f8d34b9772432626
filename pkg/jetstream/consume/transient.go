package consume

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrTransient is wrapped by an error that Transient marked: a failure of
// the infrastructure (NATS, JetStream, a KV bucket), not of the handler,
// which the runner retries in place without using up the message's delivery
// budget.
var ErrTransient = errors.New("transient infrastructure failure")

type transientError struct{ err error }

func (e transientError) Error() string { return e.err.Error() }
func (e transientError) Unwrap() []error {
	return []error{e.err, ErrTransient}
}

// Transient marks err as a failure of the infrastructure, worth retrying
// as is; IsTransient recognizes the usual ones of NATS and JetStream without
// it.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return transientError{err}
}

// transientCauses are the NATS and JetStream errors that say the servers did
// not answer in time, or not yet: a leader election, a node down, a
// connection being re-established. None says anything about the message.
var transientCauses = []error{
	ErrTransient,
	nats.ErrNoResponders,
	nats.ErrTimeout,
	nats.ErrConnectionReconnecting,
	nats.ErrReconnectBufExceeded,
	nats.ErrSlowConsumer,
	jetstream.ErrNoStreamResponse,
	jetstream.ErrConsumerLeadershipChanged,
	jetstream.ErrNoHeartbeat,
	// A request to the servers that got no answer within its own bound: a
	// handler's I/O all goes to NATS (a model call's timeout ends the run
	// instead, and never reaches the runner).
	context.DeadlineExceeded,
}

// JetStream API error codes (nats-server's jetstream_errors.json) of stores
// that are there but cannot answer now; nats.go names none of them.
const (
	jsErrClusterNotLeader = 10009 // "JetStream cluster can not handle request": an election
	jsErrStreamOffline    = 10118 // "stream is offline": its node is down (R1), or it lost quorum
	jsErrConsumerOffline  = 10119 // "consumer is offline"
)

// IsTransient reports whether err is a failure of the infrastructure rather
// than of the handler: marked by Transient, one of the NATS and JetStream
// errors of servers that did not (yet) answer, a JetStream API error of
// status 503 (no quorum, JetStream temporarily unavailable), or one that
// says a stream or consumer is offline or its cluster has no leader now. A
// Permanent error is never transient.
func IsTransient(err error) bool {
	if err == nil || IsPermanent(err) {
		return false
	}
	for _, c := range transientCauses {
		if errors.Is(err, c) {
			return true
		}
	}
	var api *jetstream.APIError
	if !errors.As(err, &api) {
		return false
	}
	switch api.ErrorCode {
	case jsErrClusterNotLeader, jsErrStreamOffline, jsErrConsumerOffline:
		return true
	}
	return api.Code == 503
}
