// Package dlqtools are the dead-letter queue as tools, for an operations
// agent: list_dlq_events, get_dlq_event_detail (what failed, where, and its
// failure history, sanitized) and replay_dlq_event (side effects writes,
// risk high: a call waits for an operator under every autonomy; a reason is
// required and recorded with who replayed what, as `toolwire dlq replay
// --reason` records it). They run in a worker (package worker) on a queue
// of their own, Queue, on the JetStream of the worker's process: a
// connection of the operations role (Connect), which reaches the dead
// letters, their audit and the replay of announcements, nothing else; the
// worker itself connects with its worker identity (`toolwire dlq serve` runs
// both).
package dlqtools

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/service/identity"
	"github.com/toolwire/toolwire/worker"
)

// Queue is the queue the tools are served on.
const Queue = "ops"

// Version is the tools' version.
const Version = "1.0.0"

// maxListed bounds what list_dlq_events returns.
const maxListed = 100

// ListIn filters list_dlq_events.
type ListIn struct {
	Stream   string `json:"stream,omitempty" jsonschema:"only dead letters of this stream, e.g. TOOLWIRE_CALLS"`
	Consumer string `json:"consumer,omitempty" jsonschema:"only dead letters of this consumer, e.g. recorder-calls"`
	Limit    int    `json:"limit,omitempty" jsonschema:"at most this many, oldest first (default and most 100)"`
}

// Listed is one dead letter as list_dlq_events shows it.
type Listed struct {
	Seq        uint64    `json:"seq"`
	Subject    string    `json:"subject"`
	Stream     string    `json:"stream"`
	Consumer   string    `json:"consumer"`
	EventType  string    `json:"event_type,omitempty"`
	Deliveries uint64    `json:"deliveries"`
	Error      string    `json:"error"`
	DeadAt     time.Time `json:"dead_at"`
}

// ListOut is list_dlq_events's answer.
type ListOut struct {
	DeadLetters []Listed `json:"dead_letters"`
	More        bool     `json:"more"`
}

// GetIn names a dead letter.
type GetIn struct {
	Seq uint64 `json:"seq" jsonschema:"the dead letter's sequence, from list_dlq_events"`
}

// Failure is one failed delivery.
type Failure struct {
	Attempt uint64    `json:"attempt"`
	At      time.Time `json:"at"`
	Error   string    `json:"error"`
}

// Detail is get_dlq_event_detail's answer: no body (it may hold anything);
// its size and digest.
type Detail struct {
	Listed
	EventID string    `json:"event_id,omitempty"`
	History []Failure `json:"history"`
	Bytes   int       `json:"bytes"`
	SHA256  string    `json:"sha256,omitempty"`
}

// ReplayIn asks for a replay.
type ReplayIn struct {
	Seq    uint64 `json:"seq" jsonschema:"the dead letter's sequence, from list_dlq_events"`
	Reason string `json:"reason" jsonschema:"why it may go again (the cause fixed): recorded with who replayed it"`
}

// ReplayOut is where a replay went.
type ReplayOut struct {
	Seq         uint64 `json:"seq"`
	Subject     string `json:"subject"`
	ReplayedTo  string `json:"replayed_to"`
	ReplayedSeq uint64 `json:"replayed_seq"`
	Duplicate   bool   `json:"duplicate"`
	RecordedBy  string `json:"recorded_by"`
}

// Connect opens the connection the tools read and replay dead letters on:
// to url, signed in as the operations role with the nkey seed in seedFile
// (operations.nk, which toolwire identities makes), its replies under the
// role's inbox prefix; unauthenticated when seedFile is empty (a server
// without authentication). Close it with js.Conn().Close() once the worker
// has stopped.
func Connect(url, seedFile string, opts ...nats.Option) (jetstream.JetStream, error) {
	if seedFile != "" {
		sign, err := identity.ConnectOptions(identity.Operations, seedFile)
		if err != nil {
			return nil, fmt.Errorf("dlqtools: the operations identity: %w", err)
		}
		opts = append(sign, opts...)
	}
	nc, err := nats.Connect(url, append([]nats.Option{nats.Name("toolwire-dlqtools")}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("dlqtools: connect to %s: %w", url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("dlqtools: %w", err)
	}
	return js, nil
}

// Tools are the three tools on js.
func Tools(js jetstream.JetStream) []*worker.Tool {
	list := worker.Func(worker.Def{Name: "list_dlq_events", Version: Version, Queue: Queue, Category: worker.CategoryData,
		SideEffects: worker.SideEffectsReads, Timeout: 30 * time.Second,
		Description: "Lists the dead letters (events that failed every delivery), oldest first: where each failed and why."},
		func(ctx context.Context, in ListIn) (ListOut, error) {
			if in.Limit < 0 || in.Limit > maxListed {
				return ListOut{}, worker.Errorf(worker.CodeValidation, "limit %d: want 1 to %d", in.Limit, maxListed)
			}
			limit := in.Limit
			if limit == 0 {
				limit = maxListed
			}
			dls, err := consume.ListDeadLetters(ctx, js, consume.DeadLetterFilter{Stream: in.Stream, Consumer: in.Consumer})
			if err != nil {
				return ListOut{}, worker.Errorf(worker.CodeValidation, "%s", sanitize(err.Error()))
			}
			out := ListOut{DeadLetters: []Listed{}}
			for i, d := range dls {
				if i == limit {
					out.More = true
					break
				}
				out.DeadLetters = append(out.DeadLetters, listed(d))
			}
			return out, nil
		})
	get := worker.Func(worker.Def{Name: "get_dlq_event_detail", Version: Version, Queue: Queue, Category: worker.CategoryData,
		SideEffects: worker.SideEffectsReads, Timeout: 30 * time.Second,
		Description: "Shows one dead letter: where it failed, every failed delivery (errors sanitized of credentials), its size; not its body."},
		func(ctx context.Context, in GetIn) (Detail, error) {
			d, err := consume.GetDeadLetter(ctx, js, in.Seq)
			if errors.Is(err, consume.ErrDeadLetterNotFound) {
				return Detail{}, worker.Errorf(worker.CodeValidation, "no dead letter %d: see list_dlq_events", in.Seq)
			}
			if err != nil {
				return Detail{}, err
			}
			out := Detail{Listed: listed(d), EventID: d.EventID, History: []Failure{}, Bytes: len(d.Data), SHA256: d.SHA256}
			if d.Bytes > 0 {
				out.Bytes = d.Bytes
			}
			for _, f := range d.History {
				out.History = append(out.History, Failure{Attempt: f.Attempt, At: f.At, Error: sanitize(f.Error)})
			}
			return out, nil
		})
	replay := worker.Func(worker.Def{Name: "replay_dlq_event", Version: Version, Queue: Queue, Category: worker.CategoryData,
		SideEffects: worker.SideEffectsWrites, Timeout: 30 * time.Second,
		// High: under every autonomy of the default gate matrix, a call
		// waits for an operator (docs/policy.md, Gates).
		Risk:        &worker.RiskPolicy{Default: worker.RiskHigh},
		Description: "Publishes a dead letter again on its original subject, once its cause is fixed, and records why and who."},
		func(ctx context.Context, in ReplayIn) (ReplayOut, error) {
			if strings.TrimSpace(in.Reason) == "" {
				return ReplayOut{}, worker.Errorf(worker.CodeValidation, "a replay needs a reason: why the dead letter may go again")
			}
			d, err := consume.GetDeadLetter(ctx, js, in.Seq)
			if errors.Is(err, consume.ErrDeadLetterNotFound) {
				return ReplayOut{}, worker.Errorf(worker.CodeValidation, "no dead letter %d: see list_dlq_events", in.Seq)
			}
			if err != nil {
				return ReplayOut{}, err
			}
			if !identity.Operations.Permissions().MayPublish(d.Subject) {
				// The server would refuse the publish; say why at once.
				return ReplayOut{}, worker.Errorf(worker.CodeValidation,
					"dead letter %d is a command (%s), not an announcement: an operations agent cannot replay it; an operator can (toolwire dlq replay %d --reason ...)",
					in.Seq, d.Subject, in.Seq)
			}
			c := worker.CallOf(ctx)
			by := fmt.Sprintf("agent run %s (call %s), approved by an operator", c.RunID, c.CallID)
			r, err := consume.ReplayDeadLetterAs(ctx, js, in.Seq, in.Reason, by)
			if errors.Is(err, consume.ErrDeadLetterNotFound) {
				return ReplayOut{}, worker.Errorf(worker.CodeValidation, "no dead letter %d: see list_dlq_events", in.Seq)
			}
			if err != nil {
				return ReplayOut{}, err
			}
			return ReplayOut{Seq: in.Seq, Subject: r.DeadLetter.Subject, ReplayedTo: r.Stream, ReplayedSeq: r.Seq, Duplicate: r.Duplicate, RecordedBy: by}, nil
		})
	return []*worker.Tool{list, get, replay}
}

func listed(d consume.DeadLetter) Listed {
	return Listed{Seq: d.Seq, Subject: d.Subject, Stream: d.Stream, Consumer: d.Consumer, EventType: d.EventType,
		Deliveries: d.Deliveries, Error: sanitize(d.Error), DeadAt: d.DeadAt}
}

// credentialRE matches what looks like a credential in an error message:
// key=value pairs of secret-sounding keys, bearer and basic credentials,
// well-known key prefixes, URLs with user info.
var credentialRE = regexp.MustCompile(`(?i)((passw(or)?d|pwd|secret|token|api[_-]?key|auth(orization)?)\s*[=:]\s*)\S+|` +
	`(bearer|basic)\s+[A-Za-z0-9._~+/=-]+|\b(sk|pk|rk)[-_][A-Za-z0-9_-]{12,}|\bgh[pousr]_[A-Za-z0-9]{20,}|\bAKIA[0-9A-Z]{16}\b|` +
	`(://)[^/\s:@]+:[^/\s@]+@`)

// sanitize strips credentials from a failure's message, and bounds it.
func sanitize(s string) string {
	s = credentialRE.ReplaceAllStringFunc(s, func(m string) string {
		switch {
		case strings.HasPrefix(m, "://"):
			return "://[redacted]@"
		case strings.ContainsAny(m, "=:") && !strings.HasPrefix(strings.ToLower(m), "bearer") && !strings.HasPrefix(strings.ToLower(m), "basic"):
			i := strings.IndexAny(m, "=:")
			return m[:i+1] + "[redacted]"
		}
		return "[redacted]"
	})
	if len(s) > 2000 {
		s = s[:2000] + "…"
	}
	return s
}
