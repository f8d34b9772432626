// Package client is how an upstream system talks to toolwire over NATS: submit
// a run request, follow a run's events as they happen, and wait for its
// outcome. It needs nothing but a JetStream handle.
//
// A run's events (contract v2) are its request, one event per model turn
// (the loop rules' verdict, the response and its cost, the calls it made),
// per call its approval (or a POLICY_DENIED completion) and its completion
// (with its cost), a started event for a call or a first model call that is
// slow, and its end. A completed run's outputs are in its completed event
// when small, else in a blob it names: Follow, Wait and Run return them either
// way.
package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/blobs"
	"github.com/toolwire/toolwire/pkg/jetstream/direct"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
)

// Client submits and follows runs.
type Client struct {
	js     jetstream.JetStream
	pub    *publish.Publisher
	source string
	// drain is FollowDrain, and lastCall lastCallEvent, but in tests.
	drain    time.Duration
	lastCall func(ctx context.Context, filter string) (uint64, error)
}

// New returns a client on js; source names the caller in its events
// (default "/toolwire/client").
func New(js jetstream.JetStream, source string) *Client {
	if source == "" {
		source = "/toolwire/client"
	}
	c := &Client{js: js, pub: publish.NewPublisher(js), source: source, drain: FollowDrain}
	c.lastCall = c.lastCallEvent
	return c
}

// Submit validates a run request and publishes it, on the condition that
// its run id has no request yet: a run id names one run. Submitting the same
// request again (a retry whose first answer was lost) is not an error and
// starts the run once; another request under a run id that has one is
// refused with ErrRunExists. The condition travels with the stored request
// and spares the orchestrator a look for an earlier run.
func (c *Client) Submit(ctx context.Context, req envelope.RunRequest) error {
	out, err := c.build(ctx, req, events.NewRunRequested)
	if err != nil {
		return err
	}
	stored, err := c.pub.PublishFirst(ctx, out)
	if err != nil || stored {
		return err
	}
	// Refused: the request there is this one (a retry) or another's.
	runs, err := c.js.Stream(ctx, events.StreamRuns)
	if err != nil {
		return fmt.Errorf("run %s: a request is stored already, and cannot be read: %w", req.RunID, err)
	}
	m, err := runs.GetLastMsgForSubject(ctx, out.Subject)
	if err != nil {
		return fmt.Errorf("run %s: a request is stored already, and cannot be read: %w", req.RunID, err)
	}
	// Every request of a run has the run's id (events.RunRequestedID), so
	// the id alone does not say that the stored request is this one: its
	// data does.
	if m.Header.Get(events.HeaderMsgID) == out.Event.ID() && bytes.Equal(m.Data, out.Event.Data()) {
		return nil
	}
	return fmt.Errorf("%w: run %s was requested by another request (%s)", ErrRunExists, req.RunID, m.Header.Get(events.HeaderMsgID))
}

// ErrRunExists is returned by Submit for a request under a run id that has
// another request already.
var ErrRunExists = errors.New("run id taken")

func (c *Client) build(ctx context.Context, req envelope.RunRequest,
	build func(string, envelope.RunRequest, events.RunTrace) (events.Outgoing, error),
) (events.Outgoing, error) {
	if err := req.Validate(); err != nil {
		return events.Outgoing{}, err
	}
	return build(c.source, req, events.RunTraceFrom(ctx))
}

// SubmitToIntake validates a run request and hands it in on its tenant's
// intake subject (toolwire.intake.<org>.<workspace>.<run_id>), which the
// orchestrator takes as the run's request once it has checked that the
// request is the subject's tenant's and its run id no other tenant's run.
// It is how a producer limited to one tenant submits (its NATS credentials
// allow that subject and nothing else: `toolwire identities --tenant`); such
// a producer follows its runs through the recorder's API with a token of
// its org, not with Follow. A tenant an intake subject cannot name (an org
// or workspace id that is not 1-64 letters, digits, '-' or '_') is refused
// with events.ErrIntakeTenant.
func (c *Client) SubmitToIntake(ctx context.Context, req envelope.RunRequest) error {
	out, err := c.build(ctx, req, events.NewRunIntake)
	if err != nil {
		return err
	}
	// The intake stream dedupes on the Nats-Msg-Id, which every producer
	// chooses: one that another tenant can guess (its subject, say) could be
	// taken by that tenant first, and this request dropped as its duplicate.
	// A nonce of this call makes it unguessable; the publisher's retries
	// reuse it, and a request handed in twice is one run all the same (the
	// orchestrator hands over one request per run id).
	nonce, err := intakeNonce()
	if err != nil {
		return err
	}
	out.MsgID += "/" + nonce
	return c.pub.Publish(ctx, out)
}

// intakeNonce is 128 random bits in hex.
func intakeNonce() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("intake: a nonce for the Nats-Msg-Id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// Event is one event of a run, decoded, or (with WithDeltas) one delta of
// its model's streamed answer.
type Event struct {
	Subject events.ParsedSubject
	Event   *event.Event
	// Delta is set, and Subject and Event are zero, for a delta (no stream
	// keeps it: the turn event it leads to is the record).
	Delta *events.Delta
}

// Follow delivers every event of the run (run and call subjects, from the
// first) to fn until fn returns false, ctx ends, or the run ends; it returns
// the run's final status when it ended, a completed run's outputs and pinned
// handles in it even when its event left them in a blob (an error wrapping
// ErrOutputsUnreadable, with the status, when the blob cannot be read).
//
// Order: fn sees the run's own events (request, turns, end) in the order they
// were stored, and each call's events in theirs, after the turn that asked
// for the call; the run's end comes last, after every call event stored by
// then. The two streams are read side by side and either may be ahead (a
// call's envelope can be stored before the turn that asked for it reaches a
// reader, and the end before the last envelopes): Follow holds what came
// early. It waits at most FollowDrain, once the end came, for the call
// events stored before it; past that, the status comes with an error
// wrapping ErrEventsMissed. With a nil fn nothing is delivered and the end is
// returned at once.
//
// WithDeltas has fn see the run's deltas too, among its events;
// WithSubscribed runs a function (a submit) once Follow listens.
func (c *Client) Follow(ctx context.Context, runID string, fn func(Event) bool, opts ...FollowOption) (*events.RunStatus, error) {
	var cfg followConfig
	for _, o := range opts {
		o(&cfg)
	}
	runSubj, err := events.RunEvents(runID)
	if err != nil {
		return nil, err
	}
	callSubj, err := events.CallEvents(runID)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Live events only wake the readers up: what is read is what the
	// streams stored, in their order, by direct gets (no consumer: a
	// producer's account may not create one).
	wake := make(chan struct{}, 1)
	nc := c.js.Conn()
	for _, subj := range []string{runSubj, callSubj} {
		sub, err := nc.Subscribe(subj, func(*nats.Msg) {
			select {
			case wake <- struct{}{}:
			default:
			}
		})
		if err != nil {
			return nil, fmt.Errorf("follow %s: %w", subj, err)
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	// The deltas, when asked for, on the same connection.
	var (
		feed   *deltaFeed
		deltas <-chan *nats.Msg
	)
	if cfg.deltas && fn != nil {
		if feed, err = subscribeDeltas(nc, runID); err != nil {
			return nil, err
		}
		defer func() { _ = feed.sub.Unsubscribe() }()
		deltas = feed.msgs
	}
	fctx, fcancel := context.WithTimeout(ctx, followFlush)
	err = nc.FlushWithContext(fctx)
	fcancel()
	if err != nil {
		return nil, fmt.Errorf("follow %s: %w", runID, err)
	}
	if cfg.subscribed != nil {
		if err := cfg.subscribed(ctx); err != nil {
			return nil, err
		}
	}
	readers := []*reader{
		{js: c.js, stream: events.StreamRuns, filter: runSubj},
		{js: c.js, stream: events.StreamCalls, filter: callSubj, call: true},
	}
	var pending []followed
	poll := time.NewTicker(followPoll)
	defer poll.Stop()
	// next is the next event read: from the readers, else, once the live
	// events say there is more (or the poll's backstop), read again.
	next := func(drain <-chan time.Time) (followed, bool, error) {
		woken := 0
		for len(pending) == 0 {
			for _, r := range readers {
				got, err := r.read(ctx)
				if err != nil {
					return followed{}, false, err
				}
				pending = append(pending, got...)
			}
			// The deltas published before what was read are in by now:
			// they go before it.
			if feed != nil && feed.absorb() > 0 && len(pending) == 0 {
				return followed{delta: true}, true, nil
			}
			if len(pending) > 0 {
				break
			}
			if woken > 0 && woken < wokenRetries {
				// A live event can come a moment before its stream has
				// stored it.
				woken++
				select {
				case <-ctx.Done():
					return followed{}, false, ctx.Err()
				case <-time.After(time.Duration(woken) * time.Millisecond):
				}
				continue
			}
			select {
			case <-ctx.Done():
				return followed{}, false, ctx.Err()
			case <-drain:
				return followed{}, false, nil
			case m := <-deltas:
				feed.take(m)
				return followed{delta: true}, true, nil
			case <-wake:
				woken = 1
			case <-poll.C:
				woken = 0
			}
		}
		it := pending[0]
		pending = pending[1:]
		return it, true, nil
	}
	var (
		lastCall uint64 // the stream sequence of the last call event read
		// end is the run's end once it came, held back from fn until
		// the calls reader has read callsUntil, the last call event
		// stored by then (0: none).
		end        *events.RunStatus
		endEv      Event
		callsUntil uint64
		drain      <-chan time.Time
		order      = newCallOrder()
	)
	// deliver hands fn an event, with the deltas due before it and those
	// it lets go.
	deliver := func(e Event) bool {
		if feed == nil {
			return fn(e)
		}
		if !sendDeltas(fn, feed.order.before(e)) || !fn(e) {
			return false
		}
		feed.order.delivered(e)
		return feed.send(fn)
	}
	for end == nil || lastCall < callsUntil {
		it, ok, err := next(drain)
		if err != nil {
			return nil, err
		}
		// The deltas that may go go first: they came before what is read.
		if feed != nil && !feed.send(fn) {
			return nil, nil
		}
		if it.delta {
			continue
		}
		if !ok {
			out, err := c.withOutputs(ctx, end)
			return out, errors.Join(fmt.Errorf("%w: run %s ended, and the calls stream did not deliver its events up to sequence %d within %s (last read: %d)",
				ErrEventsMissed, runID, callsUntil, c.drain, lastCall), err)
		}
		if it.call {
			lastCall = max(lastCall, it.seq)
		}
		if it.err != nil {
			continue // not ours to judge; the recorder dead-letters malformed events
		}
		typ := it.ev.Event.Type()
		if end == nil && events.IsEndType(typ) {
			var st events.RunStatus
			if err := events.DecodeData(it.ev.Event, &st); err != nil {
				return nil, err
			}
			end, endEv = &st, it.ev
			if fn == nil {
				return c.withOutputs(ctx, end)
			}
			seq, err := c.lastCall(ctx, callSubj)
			if err != nil {
				out, oerr := c.withOutputs(ctx, end)
				return out, errors.Join(err, oerr)
			}
			callsUntil = seq
			t := time.NewTimer(c.drain)
			defer t.Stop()
			drain = t.C
			continue
		}
		if fn != nil && !order.deliver(it.ev, deliver) {
			return nil, nil
		}
	}
	if fn != nil && (!order.flush(deliver) || !deliver(endEv)) {
		return nil, nil
	}
	return c.withOutputs(ctx, end)
}

// followPoll is how often Follow reads the streams when no live event has
// woken it (a backstop: a live event can be lost on a reconnect), and
// wokenRetries how often it reads again, a millisecond more apart each time,
// when a live event woke it but its stream had not stored it yet.
const (
	followFlush  = 5 * time.Second // bounds the wait for the live subscriptions to be in place
	followPoll   = 250 * time.Millisecond
	wokenRetries = 8
)

// reader reads the events of one stream on a filter, from the first, in
// the order they were stored, by batched direct gets.
type reader struct {
	js     jetstream.JetStream
	stream string
	filter string
	call   bool
	next   uint64 // the sequence to read from
}

// read returns the events stored since the last read.
func (r *reader) read(ctx context.Context) ([]followed, error) {
	var out []followed
	for {
		msgs, more, err := direct.Batch(ctx, r.js, r.stream, r.filter, r.next, direct.MaxBatch)
		if err != nil {
			return nil, fmt.Errorf("follow %s: %w", r.filter, err)
		}
		for _, m := range msgs {
			r.next = m.Sequence + 1
			it := followed{call: r.call, seq: m.Sequence}
			e, err := events.Decode(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
			if err != nil {
				it.err = err
			} else if p, perr := events.ParseSubject(m.Subject); perr != nil {
				it.err = perr
			} else {
				it.ev = Event{Subject: p, Event: e}
			}
			out = append(out, it)
		}
		if !more {
			return out, nil
		}
	}
}

// followed is an event Follow read, or why it could not.
type followed struct {
	ev    Event
	delta bool // a delta came (it is in the feed), not an event
	err   error
	call  bool   // from the calls stream
	seq   uint64 // its stream sequence
}

// callOrder holds a call's events until the turn that asked for the call
// has been delivered.
type callOrder struct {
	asked map[string]bool    // call ids of the turns delivered
	held  map[string][]Event // events of calls not asked for yet, in order
	ids   []string           // the calls of held, in the order they came
}

func newCallOrder() *callOrder {
	return &callOrder{asked: map[string]bool{}, held: map[string][]Event{}}
}

// deliver hands e to fn, or holds it: a call's event until its turn is
// delivered; a turn is followed by its calls' events held so far. It
// returns false when fn does.
func (o *callOrder) deliver(e Event, fn func(Event) bool) bool {
	if e.Subject.Kind == "call" && !o.asked[e.Subject.CallID] {
		if _, ok := o.held[e.Subject.CallID]; !ok {
			o.ids = append(o.ids, e.Subject.CallID)
		}
		o.held[e.Subject.CallID] = append(o.held[e.Subject.CallID], e)
		return true
	}
	if !fn(e) {
		return false
	}
	if e.Event.Type() != events.TypeTurnCompleted {
		return true
	}
	var t events.Turn
	if events.DecodeData(e.Event, &t) != nil {
		return true // its calls' events come at the end
	}
	for _, c := range t.Calls {
		o.asked[c.CallID] = true
	}
	kept := o.ids[:0]
	for _, id := range o.ids {
		if !o.asked[id] {
			kept = append(kept, id)
			continue
		}
		for _, ce := range o.held[id] {
			if !fn(ce) {
				return false
			}
		}
		delete(o.held, id)
	}
	o.ids = kept
	return true
}

// flush hands fn every event still held (calls no delivered turn asked for),
// in the order they came.
func (o *callOrder) flush(fn func(Event) bool) bool {
	for _, id := range o.ids {
		for _, e := range o.held[id] {
			if !fn(e) {
				return false
			}
		}
	}
	o.ids, o.held = nil, map[string][]Event{}
	return true
}

// FollowDrain bounds how long Follow waits, once a run has ended, for the
// call events stored before its end.
const FollowDrain = 30 * time.Second

// ErrEventsMissed is wrapped by Follow when the run ended but call events
// stored before its end were not delivered within FollowDrain (they were
// deleted meanwhile, or the server is unreachable); the status comes with it.
var ErrEventsMissed = errors.New("follow: call events of the run were not delivered")

// lastCallEvent returns the stream sequence of the last event on the calls
// subjects of the run (filter), 0 when it has none.
func (c *Client) lastCallEvent(ctx context.Context, filter string) (uint64, error) {
	s, err := c.js.Stream(ctx, events.StreamCalls)
	if err != nil {
		return 0, fmt.Errorf("follow: %s: %w", events.StreamCalls, err)
	}
	m, err := s.GetLastMsgForSubject(ctx, filter)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("follow: last event on %s: %w", filter, err)
	}
	return m.Sequence, nil
}

// withOutputs returns st with a completed run's outputs read from their blob
// when its event left them there.
func (c *Client) withOutputs(ctx context.Context, st *events.RunStatus) (*events.RunStatus, error) {
	if st.OutputsBlob != nil && st.Outputs == nil {
		doc, err := c.Outputs(ctx, st)
		if err != nil {
			return st, err
		}
		st.Outputs, st.Pinned = doc.Outputs, doc.Pinned
	}
	return st, nil
}

// ErrRunFailed is wrapped by Wait when the run ended in failure.
var ErrRunFailed = errors.New("run failed")

// ErrRunCancelled is wrapped by Wait when the run was cancelled.
var ErrRunCancelled = errors.New("run cancelled")

// ErrOutputsUnreadable is wrapped when a completed run's outputs are in a
// blob that cannot be read.
var ErrOutputsUnreadable = errors.New("run outputs unreadable")

// Outputs returns a completed run's outputs and pinned handles: those its
// completed event carried, or the document in the blob it named instead
// (OutputsBlob) when they were too large for an event.
func (c *Client) Outputs(ctx context.Context, st *events.RunStatus) (events.OutputsDocument, error) {
	if st.OutputsBlob == nil {
		return events.OutputsDocument{Outputs: st.Outputs, Pinned: st.Pinned}, nil
	}
	bad := func(err error) (events.OutputsDocument, error) {
		return events.OutputsDocument{}, fmt.Errorf("%w: run %s: outputs blob %s: %w", ErrOutputsUnreadable, st.RunID, st.OutputsBlob.URL, err)
	}
	name, ok := strings.CutPrefix(st.OutputsBlob.URL, blobs.URLPrefix)
	if !ok || st.OutputsBlob.Kind != envelope.AttachmentBlob {
		return bad(fmt.Errorf("not a blob of %s", blobs.URLPrefix))
	}
	b, _, err := blobs.Get(ctx, c.js, name)
	if err != nil {
		return bad(err)
	}
	var doc events.OutputsDocument
	if err := json.Unmarshal(b, &doc); err != nil {
		return bad(err)
	}
	return doc, nil
}

// Wait waits for the run to end and returns its final status, with its
// outputs (see Follow); a failed run is returned together with an error
// wrapping ErrRunFailed and its reason (ErrRunCancelled for a cancelled
// one).
func (c *Client) Wait(ctx context.Context, runID string) (*events.RunStatus, error) {
	st, err := c.Follow(ctx, runID, nil)
	if err != nil {
		return st, err
	}
	switch st.Status {
	case events.StatusFailed:
		return st, fmt.Errorf("%w: %s", ErrRunFailed, st.Reason)
	case events.StatusCancelled:
		return st, fmt.Errorf("%w: %s", ErrRunCancelled, st.Reason)
	}
	return st, nil
}

// Run submits the request and waits for its outcome, bounded by timeout: the
// final status with the outputs, whether the completed event carried them or
// named their blob.
func (c *Client) Run(ctx context.Context, req envelope.RunRequest, timeout time.Duration) (*events.RunStatus, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	if err := c.Submit(ctx, req); err != nil {
		return nil, err
	}
	return c.Wait(ctx, req.RunID)
}
