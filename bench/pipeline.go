package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// observer watches the pipeline's subjects with core subscriptions: it times
// each call from the turn event that asks for it to its envelope, and wakes
// whoever waits for a run's end. Every subscription feeds one channel, read
// by one goroutine, so that the copies are handled in the order the server
// sent them (separate handlers of separate subscriptions would run in either
// order). That order is almost always the turn's before its calls', not
// always: the server hands a published turn to the stream and to this
// connection one after the other, on the publisher's goroutine, and on a
// loaded host that goroutine can be held up between the two for longer than
// the whole call takes. Such a call has no latency to time (its envelope came
// first); it is counted as misordered rather than timed or lost.
type observer struct {
	nc        *nats.Conn
	handle    nats.MsgHandler
	in        chan *nats.Msg
	quit      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	callSubs  []*nats.Subscription
	mu        sync.Mutex
	turnAt    map[string]time.Time // run -> when its last turn was seen
	callLat   []time.Duration
	// early holds the runs whose envelope came before their turn (see
	// above); misordered counts them once their turn came.
	early      map[string]bool
	misordered int
	record     bool
	waiters    map[string]chan string // run id -> final status
	passed     chan struct{}          // a barrier was handled
	subs       []*nats.Subscription
}

func newObserver(nc *nats.Conn) (*observer, error) {
	o := &observer{nc: nc, turnAt: map[string]time.Time{}, early: map[string]bool{}, waiters: map[string]chan string{},
		in: make(chan *nats.Msg, 1<<16), quit: make(chan struct{}), done: make(chan struct{}), passed: make(chan struct{})}
	go func() {
		defer close(o.done)
		for {
			select {
			case m := <-o.in:
				if m.Subject == barrierSubject {
					o.passed <- struct{}{}
					continue
				}
				o.handle(m)
			case <-o.quit:
				return
			}
		}
	}()
	o.handle = func(m *nats.Msg) {
		now := time.Now()
		t := strings.Split(m.Subject, ".")
		if len(t) < 4 {
			return
		}
		o.mu.Lock()
		defer o.mu.Unlock()
		switch {
		case t[1] == "run" && len(t) == 6 && t[3] == "turn":
			if o.early[t[2]] {
				delete(o.early, t[2])
				o.misordered++
				break
			}
			o.turnAt[t[2]] = now
		case t[1] == "call" && len(t) == 5 && t[4] == "completed":
			start, ok := o.turnAt[t[2]]
			switch {
			case !o.record:
			case ok:
				o.callLat = append(o.callLat, now.Sub(start))
			default:
				o.early[t[2]] = true
			}
		case t[1] == "run" && len(t) == 4 && (t[3] == "completed" || t[3] == "failed"):
			// The run's turn stays known until recording ends: its call's
			// envelope can come after the run's end. The executor's
			// connection hands it to JetStream and to this subscription one
			// after the other, and the orchestrator may be quicker to act on
			// the stored copy than the server is to send this one.
			if ch, ok := o.waiters[t[2]]; ok {
				delete(o.waiters, t[2])
				ch <- t[3]
			}
		}
	}
	for _, s := range events.Filters(events.FilterRunCompleted, events.FilterRunFailed) {
		sub, err := nc.ChanSubscribe(s, o.in)
		if err != nil {
			o.close()
			return nil, err
		}
		_ = sub.SetPendingLimits(-1, -1)
		o.subs = append(o.subs, sub)
	}
	return o, nc.Flush()
}

// timeCalls starts (or stops) timing each call from its turn to its
// envelope. Its subscriptions cost the server a delivery per event, so they
// are off during the throughput tests, as the baseline has no observer.
func (o *observer) timeCalls(on bool) error {
	if !on {
		for _, s := range o.callSubs {
			_ = s.Unsubscribe()
		}
		o.callSubs = nil
		return o.nc.Flush()
	}
	for _, s := range events.Filters(events.FilterTurnCompleted, events.FilterCallCompleted) {
		sub, err := o.nc.ChanSubscribe(s, o.in)
		if err != nil {
			return err
		}
		_ = sub.SetPendingLimits(-1, -1)
		o.callSubs = append(o.callSubs, sub)
	}
	return o.nc.Flush()
}

func (o *observer) expect(runID string) chan string {
	ch := make(chan string, 1)
	o.mu.Lock()
	o.waiters[runID] = ch
	o.mu.Unlock()
	return ch
}

// recording starts (or stops) timing calls. Stopping waits, for at most
// callsLag, until calls envelopes have been timed (one per run measured):
// the last run's envelope may still be on its way (see handle), and may
// even not have been sent yet when the run's end was, so that a barrier
// alone can pass before it.
func (o *observer) recording(on bool, calls int) error {
	for until := time.Now().Add(callsLag); !on; {
		if err := o.barrier(); err != nil {
			return err
		}
		o.mu.Lock()
		n := len(o.callLat) + o.misordered
		o.mu.Unlock()
		if n >= calls || time.Now().After(until) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	o.mu.Lock()
	o.record = on
	if on {
		o.callLat, o.misordered = o.callLat[:0], 0
	}
	clear(o.turnAt)
	clear(o.early)
	o.mu.Unlock()
	return o.timeCalls(on)
}

// callsLag bounds the wait for the envelopes of the runs measured. It is
// reached only when one is missing, so it can be generous: under a loaded
// CI host (-race, other test binaries beside) 2 s once left one behind.
const callsLag = 10 * time.Second

// barrierSubject marks the observer's barrier in its channel; no server
// subject has a space.
const barrierSubject = "bench barrier"

// barrier returns once every message the server sent before a round trip
// has been handled.
func (o *observer) barrier() error {
	if err := o.nc.Flush(); err != nil {
		return err
	}
	o.in <- &nats.Msg{Subject: barrierSubject}
	select {
	case <-o.passed:
		return nil
	case <-o.done:
		return errors.New("bench: the observer stopped")
	}
}

// calls returns the calls timed and how many more were misordered.
func (o *observer) calls() ([]time.Duration, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]time.Duration(nil), o.callLat...), o.misordered
}

func (o *observer) close() {
	_ = o.timeCalls(false)
	for _, s := range o.subs {
		_ = s.Unsubscribe()
	}
	o.subs = nil
	o.closeOnce.Do(func() {
		close(o.quit)
		<-o.done
	})
}

// runner submits scripted runs and waits for them.
type runner struct {
	c    *client.Client
	js   jetstream.JetStream // to say where a run that never ended stopped
	obs  *observer
	seq  atomic.Int64
	name string
}

// request builds a run whose scripted model makes one turn of calls (none
// when calls is empty) and then answers.
func (r *runner) request(tool string, calls []json.RawMessage) envelope.RunRequest {
	if len(calls) == 0 {
		return r.requestTurns(tool)
	}
	return r.requestTurns(tool, calls)
}

// requestTurns builds a run whose scripted model makes a turn of calls of
// tool for each element of turns, and then answers.
func (r *runner) requestTurns(tool string, turns ...[]json.RawMessage) envelope.RunRequest {
	id := fmt.Sprintf("%s-%d-%d", r.name, time.Now().UnixNano()%1e9, r.seq.Add(1))
	type call struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	script := make([]any, 0, len(turns)+1)
	maxCalls := 0
	for _, calls := range turns {
		cs := make([]call, len(calls))
		for i, a := range calls {
			cs[i] = call{Name: tool, Arguments: a}
		}
		script = append(script, map[string]any{"tool_calls": cs})
		maxCalls += len(calls)
	}
	script = append(script, map[string]any{"content": "done"})
	opts, _ := json.Marshal(map[string]any{"script": script})
	enabled := []string{}
	if tool != "" {
		enabled = append(enabled, tool+"@1.0.0")
	}
	return envelope.RunRequest{
		RunID:  id,
		Tenant: envelope.Tenant{OrgID: "bench"},
		Agent: envelope.Agent{Name: "bench", Model: envelope.Model{Provider: "scripted", Name: "zero-latency", Options: opts},
			EnabledTools: enabled, Policy: envelope.Policy{MaxToolCalls: max(64, maxCalls)}},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "go"}},
	}
}

// run submits one run and waits for its end.
func (r *runner) run(ctx context.Context, req envelope.RunRequest) (time.Duration, error) {
	ch := r.obs.expect(req.RunID)
	t := time.Now()
	if err := r.c.Submit(ctx, req); err != nil {
		return 0, err
	}
	select {
	case st := <-ch:
		if st != events.StatusCompleted {
			return 0, fmt.Errorf("run %s %s", req.RunID, st)
		}
		return time.Since(t), nil
	case <-ctx.Done():
		return 0, fmt.Errorf("run %s did not end (%s): %w", req.RunID, r.stored(req.RunID), ctx.Err())
	}
}

// stored lists the events a run stored, by subject with the run id left
// out, for the error of a run that never ended.
func (r *runner) stored(runID string) string {
	if r.js == nil {
		return "its events unknown"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var subjects []string
	for stream, filter := range map[string]string{events.StreamRuns: "toolwire.run." + runID + ".>", events.StreamCalls: "toolwire.call." + runID + ".>"} {
		c, err := r.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
		if err != nil {
			return "its events unreadable: " + err.Error()
		}
		for {
			m, err := c.Next(jetstream.FetchMaxWait(200 * time.Millisecond))
			if err != nil {
				break
			}
			subjects = append(subjects, strings.Replace(m.Subject(), "."+runID+".", ".", 1))
		}
	}
	return "stored: " + strings.Join(subjects, " ")
}

func echoArgs(k int) []json.RawMessage {
	out := make([]json.RawMessage, k)
	for i := range out {
		out[i] = json.RawMessage(`{"text":"` + strconv.Itoa(i) + `"}`)
	}
	return out
}

func sleepArgs(k, ms int) []json.RawMessage {
	out := make([]json.RawMessage, k)
	for i := range out {
		out[i] = json.RawMessage(`{"ms":` + strconv.Itoa(ms) + `}`)
	}
	return out
}
