package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Deltas are the pieces of a model's answer as it streams, for a run whose
// agent streams (envelope.Agent.Stream): published by the orchestrator on
// core NATS under the run, never stored in a stream. They are for watchers
// (the recorder's live stream, `toolwire runs follow`, the timeline); the
// turn event stays the one record, and equals what the deltas of its last
// attempt add up to. A watcher that connects mid-turn gets the deltas the
// recorder holds of the current turn, then the live ones.

// SchemaDelta names the JSON Schema of a delta (schemas/delta.schema.json).
const SchemaDelta = "delta"

// SubjectsDelta matches every delta.
const SubjectsDelta = Prefix + ".delta.>"

// DeltaSubject is where the deltas of model call iteration of a run go:
// toolwire.delta.<run_id>.<iteration>.
func DeltaSubject(runID string, iteration int) (string, error) {
	if err := envelope.ValidateRunID(runID); err != nil {
		return "", err
	}
	if iteration < 1 {
		return "", fmt.Errorf("delta: iteration %d: want 1 or more", iteration)
	}
	return Prefix + ".delta." + runID + "." + strconv.Itoa(iteration), nil
}

// DeltaRunSubjects matches the deltas of one run.
func DeltaRunSubjects(runID string) (string, error) {
	if err := envelope.ValidateRunID(runID); err != nil {
		return "", err
	}
	return Prefix + ".delta." + runID + ".*", nil
}

// Delta is one piece of a streamed answer.
type Delta struct {
	RunID     string `json:"run_id"`
	Iteration int    `json:"iteration"`
	// Attempt counts the model call's attempts from 1: a provider failure
	// mid-stream starts the call over, and the Discarded delta that
	// announces it voids what the attempt streamed.
	Attempt int `json:"attempt"`
	// Seq numbers the iteration's deltas from 1, over its attempts: a
	// watcher that sees a gap lost some (core NATS does not redeliver).
	Seq       int            `json:"seq"`
	Text      string         `json:"text,omitempty"`
	ToolCall  *DeltaToolCall `json:"tool_call,omitempty"`
	Discarded bool           `json:"discarded,omitempty"`
}

// DeltaToolCall is a piece of the answer's tool call Index (from 0): its
// provider id and name on its first piece, then pieces of its arguments'
// JSON text.
type DeltaToolCall struct {
	Index     int    `json:"index"`
	ID        string `json:"id,omitempty"`
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments,omitempty"`
}

// MaxDeltaBytes bounds an encoded delta: a provider's piece is a few
// tokens, and a larger one is split by the publisher.
const MaxDeltaBytes = 16 << 10

// ErrInvalidDelta is wrapped by DecodeDelta's errors.
var ErrInvalidDelta = errors.New("invalid delta")

// Validate checks a delta's fields.
func (d Delta) Validate() error {
	var problems []string
	if err := envelope.ValidateRunID(d.RunID); err != nil {
		problems = append(problems, err.Error())
	}
	if d.Iteration < 1 || d.Attempt < 1 || d.Seq < 1 {
		problems = append(problems, fmt.Sprintf("iteration %d, attempt %d, seq %d: each 1 or more", d.Iteration, d.Attempt, d.Seq))
	}
	n := 0
	if d.Text != "" {
		n++
	}
	if d.ToolCall != nil {
		n++
		if d.ToolCall.Index < 0 {
			problems = append(problems, fmt.Sprintf("tool_call.index %d: want 0 or more", d.ToolCall.Index))
		}
	}
	if d.Discarded {
		n++
	}
	if n != 1 {
		problems = append(problems, "a delta holds exactly one of text, tool_call, discarded")
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidDelta, strings.Join(problems, "; "))
	}
	return nil
}

// EncodeDelta validates d and encodes it.
func EncodeDelta(d Delta) ([]byte, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(d)
}

// DecodeDelta decodes and validates a delta a watcher received on subject:
// its run and iteration must be the subject's.
func DecodeDelta(subject string, data []byte) (Delta, error) {
	if len(data) > MaxDeltaBytes {
		return Delta{}, fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidDelta, len(data), MaxDeltaBytes)
	}
	var d Delta
	if err := json.Unmarshal(data, &d); err != nil {
		return Delta{}, fmt.Errorf("%w: %w", ErrInvalidDelta, err)
	}
	if err := d.Validate(); err != nil {
		return Delta{}, err
	}
	if want, _ := DeltaSubject(d.RunID, d.Iteration); subject != want {
		return Delta{}, fmt.Errorf("%w: a delta of run %s iteration %d on %s", ErrInvalidDelta, d.RunID, d.Iteration, subject)
	}
	return d, nil
}
