package main

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
)

// TestDLQCommands is the poison-message story told through the CLI: a handler
// that always fails lands the event in the dead-letter stream after the
// consumer's three attempts; `toolwire dlq list` and `show` tell where and why
// (every attempt's error); once the fault is removed, `toolwire dlq replay`
// brings the event back, the handler takes it, and the dead letter is gone.
func TestDLQCommands(t *testing.T) {
	env := eventstest.Start(t)
	var fault atomic.Bool
	fault.Store(true)
	handled := make(chan string, 4)
	r, err := consume.NewRunner(env.JS, consume.RunnerConfig{
		Spec: provision.ConsumerSpec{Stream: events.StreamCalls, Durable: "flaky-consumer",
			Filters: []string{events.SubjectsCalls}, MaxDeliver: 3},
		Backoff: func(uint64) time.Duration { return 5 * time.Millisecond },
		Logger:  discardLogger(),
		Handler: func(_ context.Context, d *consume.Delivery) error {
			if fault.Load() {
				return errors.New("the ledger service refused the write (attempt " + strconv.FormatUint(d.Attempt, 10) + ")")
			}
			handled <- d.Event.ID()
			return nil
		},
	})
	require.NoError(t, err)
	require.NoError(t, r.Start(t.Context()))
	t.Cleanup(func() { require.NoError(t, r.Stop(context.Background())) })

	callID := strings.Repeat("ab", 32)
	poison, err := events.NewCallStarted("/test", events.CallStarted{RunID: "dlq-run", CallID: callID, Name: "ledger_write",
		Version: "1.0.0", TStart: time.Now()}, envelope.Tenant{OrgID: "o"}, events.RunTrace{})
	require.NoError(t, err)
	require.NoError(t, publish.NewPublisher(env.JS).Publish(t.Context(), poison))

	var dls []consume.DeadLetter
	require.Eventually(t, func() bool {
		dls, err = consume.ListDeadLetters(t.Context(), env.JS, consume.DeadLetterFilter{})
		require.NoError(t, err)
		return len(dls) == 1
	}, 10*time.Second, 10*time.Millisecond)
	seq := strconv.FormatUint(dls[0].Seq, 10)

	out, errOut, err := runCLI(t, "", "dlq", "list", "--nats", env.URL)
	require.NoError(t, err, errOut)
	for _, want := range []string{"SEQ", seq, "TOOLWIRE_CALLS/flaky-consumer", poison.Event.ID(), "ledger service refused the write (attempt 3)"} {
		require.Contains(t, out, want)
	}
	out, _, err = runCLI(t, "", "dlq", "list", "--nats", env.URL, "--json", "--consumer", "flaky-consumer")
	require.NoError(t, err)
	var listed []consume.DeadLetter
	require.NoError(t, json.Unmarshal([]byte(out), &listed), out)
	require.Len(t, listed, 1)
	require.Equal(t, uint64(3), listed[0].Deliveries)
	out, _, err = runCLI(t, "", "dlq", "list", "--nats", env.URL, "-o", "json", "--consumer", "flaky-consumer")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal([]byte(out), &listed), out)
	require.Len(t, listed, 1, "-o json is --json")

	out, errOut, err = runCLI(t, "", "dlq", "show", seq, "--nats", env.URL)
	require.NoError(t, err, errOut)
	for _, want := range []string{"subject:", poison.Subject, "deliveries:  3", "failure history:",
		"attempt 1 at", "(attempt 1)", "attempt 2 at", "attempt 3 at", "ce-id: " + poison.Event.ID(), `"call_id": "` + callID + `"`} {
		require.Contains(t, out, want)
	}

	// The fault is fixed; the operator replays.
	fault.Store(false)
	_, _, err = runCLI(t, "", "dlq", "replay", seq, "--nats", env.URL)
	require.ErrorContains(t, err, "give --reason", "a replay says why")
	out, errOut, err = runCLI(t, "", "dlq", "replay", seq, "--reason", "the flaky handler is fixed", "--by", "alice", "--nats", env.URL)
	require.NoError(t, err, errOut)
	require.Contains(t, out, "replayed "+seq+": "+poison.Event.ID()+" on "+poison.Subject)
	// The audit says who replayed what, when and why.
	out, errOut, err = runCLI(t, "", "dlq", "audit", "--nats", env.URL)
	require.NoError(t, err, errOut)
	require.Regexp(t, `(?m)^AT\s+SEQ\s+BY\s+SUBJECT\s+CONSUMER\s+REASON$`, out)
	require.Regexp(t, `(?m)^\S+\s+`+seq+`\s+alice\s+`+regexp.QuoteMeta(poison.Subject)+`\s+\S+\s+the flaky handler is fixed$`, out)
	out, _, err = runCLI(t, "", "dlq", "audit", "--json", "--nats", env.URL)
	require.NoError(t, err)
	var audit []consume.ReplayAudit
	require.NoError(t, json.Unmarshal([]byte(out), &audit))
	require.Len(t, audit, 1)
	require.Equal(t, poison.Event.ID(), audit[0].EventID)
	require.Equal(t, "alice", audit[0].By)
	require.NotEmpty(t, audit[0].Error, "the failure that dead-lettered it")
	select {
	case id := <-handled:
		require.Equal(t, poison.Event.ID(), id)
	case <-time.After(10 * time.Second):
		t.Fatal("the replayed event never reached the handler")
	}
	_, errOut, err = runCLI(t, "", "dlq", "list", "--nats", env.URL)
	require.NoError(t, err)
	require.Contains(t, errOut, "no dead letters")

	for _, args := range [][]string{
		{"dlq", "show", "0"},
		{"dlq", "show", "x"},
		{"dlq", "replay"},
		{"dlq", "replay", seq, "--all"},
		{"dlq", "replay", seq, "--consumer", "c"},
		{"dlq", "show", seq}, // replayed: gone
		{"dlq", "list", "--stream", "A.B"},
	} {
		_, _, err := runCLI(t, "", append(args, "--nats", env.URL)...)
		require.Error(t, err, "%v", args)
	}
	_, _, err = runCLI(t, "", "dlq", "show", seq, "--nats", env.URL)
	require.ErrorIs(t, err, consume.ErrDeadLetterNotFound)
}
