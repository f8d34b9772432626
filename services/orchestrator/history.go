package orchestrator

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	ce "github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/blobs"
)

// history reads a run's own events back from the streams: its request, its
// turns and its calls' envelopes. The stream is the record of a run; the run
// state in KV only says what comes next. The conversation the model sees is
// rebuilt from it (conversations keeps the runs a replica serves in memory,
// so that the common case reads nothing).
type history struct {
	js    jetstream.JetStream
	runs  jetstream.Stream
	calls jetstream.Stream
}

// errNotRecorded is wrapped when an event of a run is not in its stream.
var errNotRecorded = errors.New("not recorded")

// errRunEnded is wrapped when a turn is not stored because the run ended
// before it: nothing may follow the run's end. It wraps errNotRecorded, for
// the callers that need not tell the two apart.
var errRunEnded = fmt.Errorf("the run has ended: %w", errNotRecorded)

// errUnreadable is wrapped when a stored event cannot be decoded: reading it
// again will not help.
var errUnreadable = errors.New("unreadable")

// last returns the last event stored on subject; errNotRecorded when none is.
func last(ctx context.Context, st jetstream.Stream, subject string) (*storedEvent, error) {
	m, err := st.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, fmt.Errorf("%s: %w", subject, errNotRecorded)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", subject, err)
	}
	ev, err := events.Decode(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w: %w", subject, errUnreadable, err)
	}
	return &storedEvent{subject: m.Subject, trace: events.TraceOf(ev), data: ev, at: m.Time}, nil
}

type storedEvent struct {
	subject string
	trace   events.RunTrace
	data    *ce.Event
	at      time.Time // when the stream stored it
}

// request reads the run's request.
func (h *history) request(ctx context.Context, runID string) (*envelope.RunRequest, error) {
	req, _, err := h.requestAt(ctx, runID)
	return req, err
}

// requestAt reads the run's request and when the stream stored it.
func (h *history) requestAt(ctx context.Context, runID string) (*envelope.RunRequest, time.Time, error) {
	subj, err := events.RunSubject(runID, events.VerbRequested)
	if err != nil {
		return nil, time.Time{}, err
	}
	e, err := last(ctx, h.runs, subj)
	if err != nil {
		return nil, time.Time{}, err
	}
	var req envelope.RunRequest
	if err := events.DecodeData(e.data, &req); err != nil {
		return nil, time.Time{}, fmt.Errorf("run %s: its request: %w", runID, err)
	}
	return &req, e.at, nil
}

// turn reads turn n of the run, with the run's trace it carries;
// errNotRecorded when the turn is not stored.
func (h *history) turn(ctx context.Context, runID string, n int) (*events.Turn, events.RunTrace, error) {
	// One read answers the common cases: the run's last event is its
	// request or an earlier turn (turn n not yet), turn n, or the end that
	// carries turn n (or an earlier one: turn n never came).
	all, err := events.FilterRunEvents.ForRun(runID)
	if err != nil {
		return nil, events.RunTrace{}, err
	}
	subj, err := events.TurnSubject(runID, n)
	if err != nil {
		return nil, events.RunTrace{}, err
	}
	e, err := last(ctx, h.runs, all)
	if err != nil {
		return nil, events.RunTrace{}, err
	}
	t, where, err := turnIn(e, runID, n)
	switch {
	case err != nil:
		return nil, events.RunTrace{}, err
	case where == turnHere:
		return t, e.trace, nil
	case where == turnNotYet:
		return nil, events.RunTrace{}, fmt.Errorf("%s: %w", subj, errNotRecorded)
	case where == turnEnded:
		return nil, events.RunTrace{}, fmt.Errorf("%s: %w", subj, errRunEnded)
	}
	// Another event came last (a started event racing the turn, an
	// approval's suspension or resumption, a later turn): read the turn's
	// subject, then the ends'.
	for _, subj := range []string{subj, runSubject(runID, events.VerbCompleted), runSubject(runID, events.VerbFailed)} {
		e, err := last(ctx, h.runs, subj)
		if errors.Is(err, errNotRecorded) {
			continue
		}
		if err != nil {
			return nil, events.RunTrace{}, err
		}
		t, where, err := turnIn(e, runID, n)
		switch {
		case where == turnHere || err != nil:
			return t, e.trace, err
		case where == turnEnded:
			return nil, events.RunTrace{}, fmt.Errorf("%s: %w", subj, errRunEnded)
		}
	}
	return nil, events.RunTrace{}, fmt.Errorf("%s: %w", subj, errNotRecorded)
}

// Where turnIn finds a turn.
const (
	turnUnknown = iota // e says nothing of it
	turnHere           // e is the turn, or the end that carries it
	turnNotYet         // e came before it would: the request, an earlier turn
	turnEnded          // e is the run's end, which came before the turn: it never will
)

// turnIn looks for turn n of the run in e, the run's last event: its turn
// event, or the end event that carries it (events.RunStatus.Turn).
func turnIn(e *storedEvent, runID string, n int) (*events.Turn, int, error) {
	p, err := events.ParseSubject(e.subject)
	if err != nil || p.Kind != "run" {
		return nil, turnUnknown, nil
	}
	switch {
	case p.Verb == events.VerbRequested:
		return nil, turnNotYet, nil
	case p.Iteration > 0 && p.Verb == events.VerbCompleted:
		switch {
		case p.Iteration < n:
			return nil, turnNotYet, nil
		case p.Iteration > n:
			return nil, turnUnknown, nil
		}
		var t events.Turn
		if err := events.DecodeData(e.data, &t); err != nil {
			return nil, turnUnknown, fmt.Errorf("run %s: turn %d: %w", runID, n, err)
		}
		return &t, turnHere, nil
	case p.Iteration == 0 && (p.Verb == events.VerbCompleted || p.Verb == events.VerbFailed):
		var st events.RunStatus
		if err := events.DecodeData(e.data, &st); err != nil {
			return nil, turnUnknown, fmt.Errorf("run %s: its %s event: %w", runID, p.Verb, err)
		}
		switch {
		case st.Turn != nil && st.Turn.Iteration == n:
			return st.Turn, turnHere, nil
		case st.Turn == nil || st.Turn.Iteration < n:
			return nil, turnEnded, nil
		}
	}
	return nil, turnUnknown, nil
}

// runSubject is a run's subject for verb; the run id was validated by the
// caller.
func runSubject(runID string, verb events.Verb) string {
	s, _ := events.RunSubject(runID, verb)
	return s
}

// envelope reads the envelope of a call of the run.
func (h *history) envelope(ctx context.Context, runID, callID string) (*envelope.ToolEnvelope, error) {
	subj, err := events.CallSubject(runID, callID, events.VerbCompleted)
	if err != nil {
		return nil, err
	}
	e, err := last(ctx, h.calls, subj)
	if err != nil {
		return nil, err
	}
	var env envelope.ToolEnvelope
	if err := events.DecodeData(e.data, &env); err != nil {
		return nil, fmt.Errorf("run %s: call %s: %w", runID, callID, err)
	}
	return &env, nil
}

// conversation is what a replica remembers of a run it serves: its request,
// the messages of its turns so far with their results, and every envelope it
// has seen, by call id.
type conversation struct {
	mu       sync.Mutex
	req      *envelope.RunRequest
	messages []envelope.Message // the system prompt, the request's messages, turns 1..through with results
	through  int
	calls    []string // the call ids of turns 1..through, in seq order
	envs     map[string]*envelope.ToolEnvelope
	// turns are the turns after through this replica published or read,
	// so that extending the conversation by them reads nothing.
	turns map[int]*events.Turn
	elem  *list.Element
}

// conversations is the replica's memory of the conversations of the runs it
// serves, least recently used first out.
type conversations struct {
	mu  sync.Mutex
	max int
	m   map[string]*conversation
	lru *list.List
}

// maxConversations bounds the runs a replica remembers.
const maxConversations = 1024

func newConversations() *conversations {
	return &conversations{max: maxConversations, m: map[string]*conversation{}, lru: list.New()}
}

// get returns the run's conversation, new when the replica has none.
func (cs *conversations) get(runID string) *conversation {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if c, ok := cs.m[runID]; ok {
		cs.lru.MoveToFront(c.elem)
		return c
	}
	c := &conversation{envs: map[string]*envelope.ToolEnvelope{}}
	c.elem = cs.lru.PushFront(runID)
	cs.m[runID] = c
	for cs.lru.Len() > cs.max {
		old := cs.lru.Back()
		delete(cs.m, old.Value.(string))
		cs.lru.Remove(old)
	}
	return c
}

// forget drops a run's conversation (the run ended).
func (cs *conversations) forget(runID string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if c, ok := cs.m[runID]; ok {
		cs.lru.Remove(c.elem)
		delete(cs.m, runID)
	}
}

// remember keeps an envelope the replica has in hand.
// rememberTurn keeps turn t of the run, published or read by this replica,
// for the conversation's next extension.
func (cs *conversations) rememberTurn(runID string, t *events.Turn) {
	c := cs.get(runID)
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.Iteration <= c.through || t.Response == nil {
		return
	}
	if c.turns == nil {
		c.turns = map[int]*events.Turn{}
	}
	c.turns[t.Iteration] = t
}

func (cs *conversations) remember(runID string, env *envelope.ToolEnvelope) {
	c := cs.get(runID)
	c.mu.Lock()
	c.envs[env.CallID] = env
	c.mu.Unlock()
}

// conversationThrough returns the run's request and the conversation through
// turn n, results included: what model call n+1 is sent. It reads from the
// stream only what the replica does not remember.
func (s *Service) conversationThrough(ctx context.Context, runID string, n int) (*envelope.RunRequest, []envelope.Message, []string, error) {
	c := s.convs.get(runID)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.req == nil {
		req, err := s.history.request(ctx, runID)
		if err != nil {
			return nil, nil, nil, err
		}
		c.mu.Unlock()
		c.start(req)
		c.mu.Lock()
	}
	if c.through > n {
		// Asked for an older turn than remembered (a late redelivery):
		// rebuild that one apart, leaving the memory as it is.
		fresh := &conversation{envs: c.envs}
		fresh.start(c.req)
		if err := s.extend(ctx, runID, fresh, n); err != nil {
			return nil, nil, nil, err
		}
		return fresh.req, fresh.messages, fresh.calls, nil
	}
	if err := s.extend(ctx, runID, c, n); err != nil {
		return nil, nil, nil, err
	}
	return c.req, slices.Clip(c.messages), slices.Clip(c.calls), nil
}

// extend adds turns c.through+1..n to c, each whole or not at all.
func (s *Service) extend(ctx context.Context, runID string, c *conversation, n int) error {
	for k := c.through + 1; k <= n; k++ {
		t := c.turns[k]
		if t == nil {
			var err error
			if t, _, err = s.history.turn(ctx, runID, k); err != nil {
				return err
			}
		}
		if t.Response == nil {
			return fmt.Errorf("run %s: turn %d has no response (it was denied)", runID, k)
		}
		msgs := []envelope.Message{{Role: envelope.RoleAssistant, Content: t.Response.Content, ToolCalls: t.Response.ToolCalls}}
		if t.Rejected != nil {
			msgs = append(msgs, envelope.Message{Role: envelope.RoleUser, Content: outputFeedback(t.Rejected)})
		}
		ids := make([]string, 0, len(t.Calls))
		for _, call := range t.Calls {
			env := c.envs[call.CallID]
			if env == nil {
				var err error
				if env, err = s.history.envelope(ctx, runID, call.CallID); err != nil {
					return err
				}
				c.envs[call.CallID] = env
			}
			content, err := s.resultContent(ctx, env)
			if err != nil {
				return err
			}
			msgs = append(msgs, envelope.Message{Role: envelope.RoleTool, ToolCallID: call.ProviderCallID, Name: call.Name,
				Content: content, IsError: env.Error != nil})
			ids = append(ids, call.CallID)
		}
		c.messages = append(c.messages, msgs...)
		c.calls = append(c.calls, ids...)
		c.through = k
		delete(c.turns, k)
	}
	return nil
}

// resultContent is what the model sees of an envelope: ToolResultContent,
// with the whole output of a truncated one read back from its blob when it
// is within the model's limit (Config.ModelOutputBytes): events stay small,
// the model still sees what a tool returned.
func (s *Service) resultContent(ctx context.Context, env *envelope.ToolEnvelope) (string, error) {
	if env.Error != nil || !env.Truncated {
		return ToolResultContent(env), nil
	}
	for _, a := range env.Attachments {
		if a.Kind != envelope.AttachmentBlob || a.Bytes <= 0 || a.Bytes > int64(s.cfg.ModelOutputBytes) {
			continue
		}
		name, ok := strings.CutPrefix(a.URL, blobs.URLPrefix)
		if !ok {
			continue
		}
		b, _, err := blobs.Get(ctx, s.JS, name)
		if errors.Is(err, blobs.ErrNotFound) {
			break // expired: the preview is what is left
		}
		if err != nil {
			return "", fmt.Errorf("output of call %s: %w", env.CallID, err)
		}
		full := *env
		full.Output = b
		return ToolResultContent(&full), nil
	}
	return ToolResultContent(env), nil
}

// envelopes returns the envelopes of the calls, in order, from memory or the
// stream.
func (s *Service) envelopes(ctx context.Context, runID string, ids []string) ([]envelope.ToolEnvelope, error) {
	c := s.convs.get(runID)
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]envelope.ToolEnvelope, 0, len(ids))
	for _, id := range ids {
		env := c.envs[id]
		if env == nil {
			var err error
			if env, err = s.history.envelope(ctx, runID, id); err != nil {
				return nil, err
			}
			c.envs[id] = env
		}
		out = append(out, *env)
	}
	return out, nil
}

// start gives a new run's conversation its request, so that its first
// model call reads nothing back.
func (c *conversation) start(req *envelope.RunRequest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.req != nil {
		return
	}
	c.req = req
	if req.Agent.SystemPrompt != "" {
		c.messages = append(c.messages, envelope.Message{Role: envelope.RoleSystem, Content: req.Agent.SystemPrompt})
	}
	c.messages = append(c.messages, req.Messages...)
}
