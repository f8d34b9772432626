// Package providertest fakes a model provider's HTTP API for the tests of the
// adapters and of the agent loop: an httptest server that speaks a
// provider's wire format as the test scripts it, whole answers or streams
// of server-sent events.
package providertest

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
)

// Model is an httptest server that speaks a provider's wire format: it
// records every request and answers each from a queue of canned replies
// (status, headers, body), repeating the last one when the queue runs out.
type Model struct {
	// URL is the server's base URL.
	URL string

	mu      sync.Mutex
	replies []Reply
	got     []Request
}

// Reply is one canned answer; a zero Status is 200, and the Content-Type is
// application/json unless Headers set one.
type Reply struct {
	Status  int
	Headers map[string]string
	Body    string
	// Events, when set, make the reply a stream of server-sent events
	// (text/event-stream) in place of Body, each written and flushed in
	// turn.
	Events []Event
	// Drop, after the Events, drops the connection: the stream breaks off
	// without its end, and the client reads an unexpected EOF.
	Drop bool
}

// Event is one server-sent event of a streamed reply: "event: Type" (no
// such line when Type is empty, as in OpenAI's streams) and "data: Data",
// then a blank line.
type Event struct {
	Type string
	Data string
	// After, when set, holds the event back until it is closed or the
	// request ends: a test closes it once its client has seen the events
	// before (Deltas.First), which shows they streamed before the reply
	// ended.
	After <-chan struct{}
}

// Data is an event of each data text, without event types.
func Data(data ...string) []Event {
	out := make([]Event, len(data))
	for i, d := range data {
		out[i] = Event{Data: d}
	}
	return out
}

// Request is a request the server received.
type Request struct {
	At     time.Time
	Method string
	Path   string
	Header http.Header
	Body   map[string]any // the JSON body, decoded
	Raw    []byte
}

// New starts a fake model that answers with replies in turn; it closes at
// the end of the test.
func New(t testing.TB, replies ...Reply) *Model {
	t.Helper()
	require.NotEmpty(t, replies, "a fake model needs at least one reply")
	m := &Model{replies: replies}
	srv := httptest.NewServer(http.HandlerFunc(m.serve))
	t.Cleanup(srv.Close)
	m.URL = srv.URL
	return m
}

func (m *Model) serve(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	var body map[string]any
	_ = json.Unmarshal(raw, &body)
	m.mu.Lock()
	n := len(m.got)
	m.got = append(m.got, Request{At: time.Now(), Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body, Raw: raw})
	rep := m.replies[min(n, len(m.replies)-1)]
	m.mu.Unlock()
	for k, v := range rep.Headers {
		w.Header().Set(k, v)
	}
	if w.Header().Get("Content-Type") == "" {
		if rep.Events != nil {
			w.Header().Set("Content-Type", "text/event-stream")
		} else {
			w.Header().Set("Content-Type", "application/json")
		}
	}
	if rep.Status == 0 {
		rep.Status = http.StatusOK
	}
	w.WriteHeader(rep.Status)
	if rep.Events == nil {
		_, _ = io.WriteString(w, rep.Body)
		return
	}
	flusher, _ := w.(http.Flusher)
	for _, ev := range rep.Events {
		if ev.After != nil {
			select {
			case <-ev.After:
			case <-r.Context().Done():
				return
			}
		}
		if ev.Type != "" {
			_, _ = io.WriteString(w, "event: "+ev.Type+"\n")
		}
		_, _ = io.WriteString(w, "data: "+ev.Data+"\n\n")
		if flusher != nil {
			flusher.Flush()
		}
	}
	if rep.Drop {
		// The server closes the connection in the middle of the chunked
		// body; the handler's panic is net/http's way to say so.
		panic(http.ErrAbortHandler)
	}
}

// Requests returns the requests received so far, in order.
func (m *Model) Requests() []Request {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Request(nil), m.got...)
}

// Tools are two tool definitions as the registry holds them.
func Tools() []envelope.ToolDefinition {
	return []envelope.ToolDefinition{
		{Name: "echo", Version: "1.0.0", Description: "Returns its input text.",
			InputSchema: json.RawMessage(`{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object",` +
				`"properties":{"text":{"type":"string","description":"The text to return."}},"required":["text"],"additionalProperties":false}`)},
		{Name: "calculator", Version: "1.0.0", Description: "Evaluates an arithmetic expression.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"expression":{"type":"string"}},"required":["expression"]}`)},
	}
}

// Turn is the request of the adapters' round trips: run r1, its first
// iteration, the system prompt "Be brief." and the two Tools.
func Turn(model envelope.Model, msgs []envelope.Message) provider.Request {
	return provider.Request{RunID: "r1", Iteration: 1, Model: model, System: "Be brief.", Messages: msgs, Tools: Tools()}
}

// Question is the conversation of a round trip's first turn, which the model
// answers with a call of each of the two Tools.
func Question() []envelope.Message {
	return []envelope.Message{
		{Role: envelope.RoleSystem, Content: "Be brief."},
		{Role: envelope.RoleUser, Content: "Echo hi and compute 42."},
	}
}

// Calls are the model's answer to the Question, as the adapter reads them:
// echo "hi", then calculator with a number where the schema wants a string.
func Calls(echoID, calculatorID string) []envelope.ToolCall {
	return []envelope.ToolCall{
		{ID: echoID, Name: "echo", Arguments: json.RawMessage(`{"text": "hi"}`)},
		{ID: calculatorID, Name: "calculator", Arguments: json.RawMessage(`{"expression": 42}`)},
	}
}

// WithResults is msgs followed by the model's turn resp (echo, then
// calculator) and the results as the orchestrator hands them back (its
// ToolResultContent), in call order: echo's, then calculator's, which
// failed with failure.
func WithResults(msgs []envelope.Message, resp envelope.ModelResponse, failure string) []envelope.Message {
	return append(msgs,
		envelope.Message{Role: envelope.RoleAssistant, Content: resp.Content, ToolCalls: resp.ToolCalls},
		envelope.Message{Role: envelope.RoleTool, ToolCallID: resp.ToolCalls[0].ID, Name: "echo", Content: `{"text":"hi"}`},
		envelope.Message{Role: envelope.RoleTool, ToolCallID: resp.ToolCalls[1].ID, Name: "calculator", IsError: true, Content: failure},
	)
}

// JSON decodes a JSON text for comparisons.
func JSON(t testing.TB, s string) any {
	t.Helper()
	var v any
	require.NoError(t, json.Unmarshal([]byte(s), &v), s)
	return v
}

// Failure is a case of an adapter's failure table: what the fake model
// replies, and what the adapter must make of it.
type Failure struct {
	Name     string
	Retries  int // the adapter's MaxRetries
	Replies  []Reply
	Attempts int           // requests the model receives
	Err      []string      // substrings of the error; none: the call succeeds
	MinGap   time.Duration // the least wait between the first two requests (Retry-After)
	Hidden   string        // must not appear in the error
}

// CheckFailures runs each case on a fake model of its replies, with the
// adapter newProvider builds for the model's base URL and the case's retries
// (its API key is key): the adapter makes the requests the case says and
// waits as long as Retry-After asks; a call that succeeds answers content;
// an error says what the case says, and never holds the key.
func CheckFailures(t *testing.T, cases []Failure, key, content string,
	newProvider func(baseURL string, retries int) provider.Provider, req provider.Request) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			m := New(t, tc.Replies...)
			resp, err := newProvider(m.URL, tc.Retries).Complete(t.Context(), req)
			got := m.Requests()
			require.Len(t, got, tc.Attempts)
			if len(tc.Err) == 0 {
				require.NoError(t, err)
				require.Equal(t, content, resp.Content)
			} else {
				require.Error(t, err)
				for _, s := range tc.Err {
					require.ErrorContains(t, err, s)
				}
				require.NotContains(t, err.Error(), key, "the key is never in an error")
				require.NotContains(t, err.Error(), "Bearer")
				if tc.Hidden != "" {
					require.NotContains(t, err.Error(), tc.Hidden)
				}
			}
			if tc.MinGap > 0 {
				require.GreaterOrEqual(t, got[1].At.Sub(got[0].At), tc.MinGap, "the retry waited as long as Retry-After said")
			}
		})
	}
}

// Deltas records what a Streamer passes to onDelta (its On).
type Deltas struct {
	mu    sync.Mutex
	got   []provider.Delta
	first chan struct{}
	once  sync.Once
}

// NewDeltas returns an empty record.
func NewDeltas() *Deltas { return &Deltas{first: make(chan struct{})} }

// On records d; it is the onDelta of a Stream.
func (d *Deltas) On(delta provider.Delta) {
	d.mu.Lock()
	d.got = append(d.got, delta)
	d.mu.Unlock()
	d.once.Do(func() { close(d.first) })
}

// First is closed once the first delta is recorded: the After of a reply's
// event that must wait for the client to see the ones before.
func (d *Deltas) First() <-chan struct{} { return d.first }

// All are the deltas recorded, in order.
func (d *Deltas) All() []provider.Delta {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]provider.Delta(nil), d.got...)
}

// Discards is how many of the deltas are Discards.
func (d *Deltas) Discards() int {
	n := 0
	for _, x := range d.All() {
		if x.Discard {
			n++
		}
	}
	return n
}

// RequireSum asserts that resp, a Stream's answer to model call iteration,
// is what its deltas add up to (provider.Accumulate).
func RequireSum(t testing.TB, iteration int, deltas []provider.Delta, resp envelope.ModelResponse) {
	t.Helper()
	sum := provider.Accumulate(iteration, deltas...)
	require.Equal(t, sum.Content, resp.Content, "the content is the text deltas joined")
	require.Equal(t, sum.ToolCalls, resp.ToolCalls, "the tool calls are the tool call deltas joined")
}

// StreamCase is a case of an adapter's stream table: what the fake model
// replies to each request, and what Stream must make of it.
type StreamCase struct {
	Name     string
	Retries  int // the adapter's MaxRetries
	Replies  []Reply
	Attempts int // requests the model receives
	Discards int // Discard deltas
	// Want is the answer when the call succeeds (Err empty).
	Want envelope.ModelResponse
	// Err are substrings of the error; none: the call succeeds.
	Err []string
}

// CheckStreams runs each case on a fake model of its replies, with the
// streaming adapter newProvider builds for the model's base URL and the
// case's retries: the adapter makes the requests the case says and sends
// the Discards it says; a call that succeeds answers Want, which is what
// the deltas since the last Discard add up to; a call that fails says what
// the case says.
func CheckStreams(t *testing.T, cases []StreamCase, newProvider func(baseURL string, retries int) provider.Streamer, req provider.Request) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			m := New(t, tc.Replies...)
			deltas := NewDeltas()
			resp, err := newProvider(m.URL, tc.Retries).Stream(t.Context(), req, deltas.On)
			require.Len(t, m.Requests(), tc.Attempts, "requests")
			require.Equal(t, tc.Discards, deltas.Discards(), "discards")
			if len(tc.Err) > 0 {
				require.Error(t, err)
				for _, s := range tc.Err {
					require.ErrorContains(t, err, s)
				}
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.Want, resp)
			RequireSum(t, req.Iteration, deltas.All(), resp)
		})
	}
}

// CallDelta is a piece of tool call i as a Streamer hands it over: its id
// and name on the first piece, then pieces of its arguments.
func CallDelta(i int, id, name, args string) provider.Delta {
	return provider.Delta{ToolCall: &provider.ToolCallDelta{Index: i, ID: id, Name: name, Arguments: args}}
}

// Ask makes one model call of p the way mode names ("Complete" or
// "Stream", deltas dropped): the tests that read what reached a provider's
// request run each case both ways.
func Ask(ctx context.Context, p provider.Streamer, mode string, req provider.Request) error {
	if mode == "Complete" {
		_, err := p.Complete(ctx, req)
		return err
	}
	_, err := p.Stream(ctx, req, nil)
	return err
}
