package events_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
)

// TestWorkerCancel: a queue's cancel subject is one of the subjects its
// workers answer on (the worker identity's permissions and its account's
// export cover it), is refused for a queue that is not a safe token, and a
// cancel names a valid run and call.
func TestWorkerCancel(t *testing.T) {
	subj, err := events.WorkerCancelSubject("billing")
	require.NoError(t, err)
	require.Equal(t, "toolwire.worker.billing.cancel", subj)
	all, err := events.WorkerSubjects("billing")
	require.NoError(t, err)
	require.Equal(t, strings.TrimSuffix(all, "*")+events.VerbWorkerCancel, subj, "covered by toolwire.worker.<queue>.*")
	for _, bad := range []string{"", "a.b", "*", ">", "Upper"} {
		_, err := events.WorkerCancelSubject(bad)
		require.Error(t, err, "%q", bad)
	}

	const call = "0123456789abcdef"
	for _, c := range []struct {
		name   string
		cancel events.WorkerCancel
		ok     bool
	}{
		{"valid", events.WorkerCancel{RunID: "run-1", CallID: call, Reason: "cancelled by ops"}, true},
		{"no reason", events.WorkerCancel{RunID: "run-1", CallID: call}, true},
		{"bad run", events.WorkerCancel{RunID: "run.1", CallID: call}, false},
		{"bad call", events.WorkerCancel{RunID: "run-1", CallID: "not hex"}, false},
		{"reason too long", events.WorkerCancel{RunID: "run-1", CallID: call, Reason: strings.Repeat("x", 4096)}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.cancel.Validate()
			if c.ok {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
			}
		})
	}
}
