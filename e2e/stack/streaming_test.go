package stack_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
	"github.com/toolwire/toolwire/stack"
)

// streamedPieces is the fake model's answer: 20 pieces.
func streamedPieces() []string {
	out := make([]string, 20)
	for i := range out {
		out[i] = fmt.Sprintf("piece %02d; ", i+1)
	}
	return out
}

// fakeModel is a provider's server that streams a 20-piece answer in its
// provider's wire format, and after the first piece waits (at most 30 s)
// until released: the rest of the answer, and so the model call's end and
// the turn event, come only after the release.
type fakeModel struct {
	released chan struct{}
	once     sync.Once
	mu       sync.Mutex
	log      []string // what the server did, in its order
}

func (f *fakeModel) release() { f.once.Do(func() { close(f.released) }) }

func (f *fakeModel) note(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, s)
}

// ServeHTTP speaks OpenAI's chat completions stream on .../chat/completions
// and Anthropic's messages stream on .../messages.
func (f *fakeModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	_ = json.NewDecoder(r.Body).Decode(&body)
	if body["stream"] != true {
		http.Error(w, "this fake model only streams", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	write := func(event string, v any) {
		b, _ := json.Marshal(v)
		if event != "" {
			fmt.Fprintf(w, "event: %s\n", event)
		}
		fmt.Fprintf(w, "data: %s\n\n", b)
		fl.Flush()
	}
	pieces := streamedPieces()
	wait := func() bool {
		f.note("sent the first piece")
		select {
		case <-f.released:
			f.note("released")
			return true
		case <-time.After(30 * time.Second):
			f.note("not released within 30s")
			return false
		case <-r.Context().Done():
			return false
		}
	}
	switch {
	case strings.HasSuffix(r.URL.Path, "/chat/completions"):
		chunk := func(delta map[string]any, finish any) map[string]any {
			return map[string]any{"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-fake",
				"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}}
		}
		for i, p := range pieces {
			d := map[string]any{"content": p}
			if i == 0 {
				d["role"] = "assistant"
			}
			write("", chunk(d, nil))
			if i == 0 && !wait() {
				return
			}
		}
		write("", chunk(map[string]any{}, "stop"))
		write("", map[string]any{"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-fake",
			"choices": []any{}, "usage": map[string]any{"prompt_tokens": 12, "completion_tokens": 40, "total_tokens": 52}})
		fmt.Fprint(w, "data: [DONE]\n\n")
	case strings.HasSuffix(r.URL.Path, "/messages"):
		write("message_start", map[string]any{"type": "message_start", "message": map[string]any{"id": "msg_1", "type": "message",
			"role": "assistant", "model": "claude-fake", "content": []any{}, "stop_reason": nil, "stop_sequence": nil,
			"usage": map[string]any{"input_tokens": 12, "output_tokens": 1}}})
		write("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]any{"type": "text", "text": ""}})
		for i, p := range pieces {
			write("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": p}})
			if i == 0 && !wait() {
				return
			}
		}
		write("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
		write("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": "end_turn", "stop_sequence": nil},
			"usage": map[string]any{"output_tokens": 40}})
		write("message_stop", map[string]any{"type": "message_stop"})
	default:
		http.NotFound(w, r)
		return
	}
	fl.Flush()
	f.note("sent the last piece")
}

// TestStreamedAnswerReachesTheSSEClientFirst: for both providers, through
// their SDKs against a server that speaks their streaming wire format, the
// first delta of a 20-piece answer reaches a client of the recorder's live
// stream while the model call is still going: the fake server sends the
// rest only once that client has the delta (its log says so, in its own
// order), so no turn could have been recorded before. The deltas add up to
// the recorded answer.
func TestStreamedAnswerReachesTheSSEClientFirst(t *testing.T) {
	fake := &fakeModel{released: make(chan struct{})}
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	db := sqlite.URL(filepath.Join(t.TempDir(), "recorder.db"))
	st := startStack(t, stack.Options{Recorder: recorder.ForStack(db), Getenv: func(k string) string {
		switch k {
		case "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL":
			return srv.URL + "/v1"
		case "OPENAI_API_KEY", "ANTHROPIC_API_KEY":
			return "test-key"
		}
		return os.Getenv(k)
	}})
	want := strings.Join(streamedPieces(), "")
	for _, p := range []struct{ provider, model string }{{"openai", "gpt-fake"}, {"anthropic", "claude-fake"}} {
		t.Run(p.provider, func(t *testing.T) {
			fake.released, fake.once, fake.log = make(chan struct{}), sync.Once{}, nil
			runID := "stream-" + p.provider
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, st.HTTPURL+"/v1/runs/"+runID+"/events/stream", nil)
			require.NoError(t, err)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)

			run := envelope.RunRequest{RunID: runID, Tenant: envelope.Tenant{OrgID: "acme"},
				Agent:    envelope.Agent{Name: "chat", Model: envelope.Model{Provider: p.provider, Name: p.model}, EnabledTools: []string{}, Stream: true},
				Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "Say twenty things."}}}
			require.NoError(t, st.Client.Submit(ctx, run))

			var text strings.Builder
			var deltas []events.Delta
			var end string
			readSSE(t, resp.Body, func(e sse) {
				switch e.event {
				case "delta":
					d, err := events.DecodeDelta(fmt.Sprintf("toolwire.delta.%s.1", runID), []byte(e.data))
					require.NoError(t, err, e.data)
					deltas = append(deltas, d)
					text.WriteString(d.Text)
					fake.note("the client got a delta")
					fake.release()
				case "end", "error":
					end = e.event
				}
			})
			require.Equal(t, "end", end)
			require.NotEmpty(t, deltas)
			fake.mu.Lock()
			log := fake.log
			fake.mu.Unlock()
			require.Equal(t, []string{"sent the first piece", "the client got a delta", "released"}, log[:3], "the server's order")
			require.Contains(t, log, "sent the last piece")
			for i, d := range deltas {
				require.Equal(t, i+1, d.Seq)
			}
			final, err := st.Client.Follow(ctx, runID, nil)
			require.NoError(t, err)
			require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
			require.Equal(t, want, final.Outputs.Response)
			require.Equal(t, want, text.String(), "the deltas add up to the answer")
		})
	}
}
