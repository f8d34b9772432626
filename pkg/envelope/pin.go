package envelope

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
)

// PinStrategy selects which call of a tool populates a pinned handle.
type PinStrategy string

// Pin strategies (docs/architecture.md, Contracts: PinnedHandle).
const (
	PinLatest       PinStrategy = "latest"        // the last call to the tool (default)
	PinFirstSuccess PinStrategy = "first_success" // the first successful call
	PinByCallID     PinStrategy = "by_call_id"    // one specific call_id
)

// OnMissing is a pinned handle's behaviour when no call matches.
type OnMissing string

// On-missing behaviours (docs/architecture.md, Contracts: PinnedHandle).
const (
	// MissingNull outputs null: the default and the safest; saved graph
	// connections never break.
	MissingNull OnMissing = "null"
	// MissingError fails the node.
	MissingError OnMissing = "error"
	// MissingStaleLastSuccess outputs the value from the agent node's last
	// successful run. Resolve cannot see other runs, so it yields null here; the
	// recorder, which stores past runs, serves the stale value.
	MissingStaleLastSuccess OnMissing = "stale_last_success"
)

// PinSelector chooses the tool call that populates a handle.
type PinSelector struct {
	Tool     string      `json:"tool"`
	Strategy PinStrategy `json:"strategy,omitempty"`
	CallID   string      `json:"call_id,omitempty"`
}

// PinnedHandle is a named output handle configured on an agent node
// (docs/architecture.md, Contracts).
// It never disappears: when its tool is disabled or not called, it outputs null
// (or what OnMissing says).
type PinnedHandle struct {
	Name      string      `json:"name"`
	Selector  PinSelector `json:"selector"`
	OnMissing OnMissing   `json:"on_missing,omitempty"`
}

var (
	pinNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]{0,63}$`)
	hexIDRE   = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// Validate checks the handle's configuration.
func (p PinnedHandle) Validate() error {
	if !pinNameRE.MatchString(p.Name) {
		return fmt.Errorf("%w: name %q must start with a letter or '_' and hold at most 64 letters, digits, '_' or '-'", ErrInvalidPin, p.Name)
	}
	if !isToolName(p.Selector.Tool) {
		return fmt.Errorf("%w %q: selector.tool %q is not a tool name", ErrInvalidPin, p.Name, p.Selector.Tool)
	}
	switch p.Selector.Strategy {
	case "", PinLatest, PinFirstSuccess:
		if p.Selector.CallID != "" {
			return fmt.Errorf("%w %q: selector.call_id is only for strategy by_call_id", ErrInvalidPin, p.Name)
		}
	case PinByCallID:
		if !hexIDRE.MatchString(p.Selector.CallID) {
			return fmt.Errorf("%w %q: strategy by_call_id needs selector.call_id, 64 lowercase hex digits", ErrInvalidPin, p.Name)
		}
	default:
		return fmt.Errorf("%w %q: selector.strategy %q is not one of latest, first_success, by_call_id", ErrInvalidPin, p.Name, p.Selector.Strategy)
	}
	switch p.OnMissing {
	case "", MissingNull, MissingError, MissingStaleLastSuccess:
	default:
		return fmt.Errorf("%w %q: on_missing %q is not one of null, error, stale_last_success", ErrInvalidPin, p.Name, p.OnMissing)
	}
	return nil
}

// Select returns the envelope the handle selects from the outputs, or nil when
// none matches.
//
// A handle whose selector names OutputToolName selects the run's validated
// final answer (AgentOutputs.Output, set by an output schema or a stop
// tool) when it has one: an envelope of that name whose output is the
// value (outputEnvelope), so that a graph pins the answer as it pins a
// tool's output.
func (p PinnedHandle) Select(out AgentOutputs) *ToolEnvelope {
	if p.Selector.Tool == OutputToolName && hasValue(out.Output) {
		return outputEnvelope(out.Output)
	}
	var found *ToolEnvelope
	for _, id := range out.ToolOrder {
		env, ok := out.ToolsByID[id]
		if !ok || env.Name != p.Selector.Tool {
			continue
		}
		switch p.Selector.Strategy {
		case "", PinLatest:
			e := env
			found = &e
		case PinFirstSuccess:
			if env.Error == nil {
				return &env
			}
		case PinByCallID:
			if id == p.Selector.CallID {
				return &env
			}
		}
	}
	return found
}

// ResolvePins resolves every handle against the run's outputs. A handle whose
// selection is empty maps to nil (JSON null) unless its on_missing is error, in
// which case ResolvePins returns an error wrapping ErrPinMissing naming it. The
// map always holds every handle's name, so the node's shape never changes.
func ResolvePins(out AgentOutputs, pins []PinnedHandle) (map[string]*ToolEnvelope, error) {
	res := make(map[string]*ToolEnvelope, len(pins))
	for _, p := range pins {
		env := p.Select(out)
		if env == nil && p.OnMissing == MissingError {
			return res, fmt.Errorf("%w: handle %q (tool %s, strategy %s)", ErrPinMissing, p.Name, p.Selector.Tool, orDefault(string(p.Selector.Strategy), string(PinLatest)))
		}
		res[p.Name] = env
	}
	return res, nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// hasValue reports whether raw holds a JSON value other than null.
func hasValue(raw json.RawMessage) bool {
	b := bytes.TrimSpace(raw)
	return len(b) > 0 && !bytes.Equal(b, []byte("null"))
}

// outputEnvelope is the envelope a pin of OutputToolName resolves to: the
// final answer's value as its output, its input {} and its call id the
// hash of the value (CallID of OutputToolName, seq 0: no call of a run
// has seq 0), so that the same answer pins under the same id.
func outputEnvelope(value json.RawMessage) *ToolEnvelope {
	id, err := CallID(OutputToolName, "", value, 0)
	if err != nil {
		id, _ = CallID(OutputToolName, "", []byte(`null`), 0)
	}
	return &ToolEnvelope{CallID: id, Name: OutputToolName, Input: json.RawMessage(`{}`), Output: value}
}
