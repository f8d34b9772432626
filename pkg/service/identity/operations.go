package identity

import (
	"slices"
	"strings"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
)

// Replayable are the events the operations role may publish again from the
// dead-letter stream: those that announce what happened (a run's start and
// end, a turn, a call's start and completion, an approval's request, a
// sandbox job's result). A replay of one brings its consumers a record they
// missed. The commands are not among them: a run request or cancel (work
// for any tenant), an approved call (it would skip the Policy Guard), a
// decision (the agent would approve its own replay), a sandbox job (code
// run unguarded); an operator replays those (toolwire dlq replay).
func Replayable() []string {
	return pub(events.FilterRunStarted, events.FilterRunSuspended, events.FilterRunResumed, events.FilterRunCompleted,
		events.FilterRunFailed, events.FilterRunCancelled, events.FilterTurnCompleted,
		events.FilterCallApprovalRequired, events.FilterCallStarted, events.FilterCallCompleted, events.FilterSandboxCompleted)
}

// operations are the operations role's permissions: the dead-letter stream
// (read, single messages deleted once replayed; never purged), the bodies
// of large dead letters, the replay audit, the Replayable subjects; its
// inbox. No other stream, bucket or live subject.
func operations() Permissions {
	pubs := flat(
		[]string{"$JS.API.INFO", "$JS.FC.>", "$JS.API.STREAM.MSG.DELETE." + events.StreamDLQ,
			// Its listings' ordered consumers, deleted when done: the
			// dead-letter stream has no durable consumer to lose.
			"$JS.API.CONSUMER.DELETE." + events.StreamDLQ + ".>"},
		read(events.StreamDLQ),
		objWrite(provision.ObjectDeadLetters),
		kvWrite(provision.BucketDLQAudit),
		Replayable(),
	)
	return Permissions{Publish: pubs, Subscribe: []string{Operations.InboxPrefix() + ".>"}}
}

// MayPublish says whether the permissions let a client publish on subject
// (a literal subject): one of Publish matches it and none of PublishDeny.
// The server decides; this tells a client beforehand, to refuse with a
// reason rather than wait for an acknowledgement that cannot come.
func (p Permissions) MayPublish(subject string) bool {
	match := func(pattern string) bool { return subjectMatches(pattern, subject) }
	return slices.ContainsFunc(p.Publish, match) && !slices.ContainsFunc(p.PublishDeny, match)
}

// subjectMatches matches a literal subject against a NATS pattern (* one
// token, > the rest).
func subjectMatches(pattern, subject string) bool {
	pt, st := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, p := range pt {
		switch {
		case p == ">":
			return len(st) > i
		case i >= len(st):
			return false
		case p != "*" && p != st[i]:
			return false
		}
	}
	return len(pt) == len(st)
}
