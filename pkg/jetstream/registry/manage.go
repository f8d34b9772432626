package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// ErrConflict is returned when a registered version is registered again with
// another definition: a changed tool is a new version (docs/architecture.md,
// Contracts: Versions).
var ErrConflict = errors.New("tool version already registered with another definition")

// ParseState parses a lifecycle state.
func ParseState(s string) (State, error) {
	st := State(s)
	if !st.Valid() {
		return "", fmt.Errorf("%w: state %q is not one of active, deprecated, blocked, draft", envelope.ErrInvalidTool, s)
	}
	return st, nil
}

// DecodeDefinition decodes a tool definition from JSON and checks everything
// that can be checked before it is stored: no unknown fields, the
// tool_definition JSON Schema, the definition's own rules, and that its input
// and output schemas compile.
func DecodeDefinition(b []byte) (envelope.ToolDefinition, error) {
	var def envelope.ToolDefinition
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&def); err != nil {
		return def, fmt.Errorf("%w: %w", envelope.ErrInvalidTool, err)
	}
	if dec.More() {
		return def, fmt.Errorf("%w: trailing content after the definition", envelope.ErrInvalidTool)
	}
	schemas, err := events.NewSchemas()
	if err != nil {
		return def, err
	}
	if err := schemas.Validate(envelope.SchemaToolDefinition, b); err != nil {
		return def, fmt.Errorf("%w: %w", envelope.ErrInvalidTool, err)
	}
	if err := def.Validate(); err != nil {
		return def, err
	}
	base := "https://toolwire.dev/tools/" + url.PathEscape(def.Name) + "/" + url.PathEscape(def.Version)
	if _, err := envelope.CompileToolSchema(base+"/input.schema.json", def.InputSchema); err != nil {
		return def, fmt.Errorf("%w %s: input_schema: %w", envelope.ErrInvalidTool, def.Ref(), err)
	}
	if len(def.OutputSchema) > 0 {
		if _, err := envelope.CompileToolSchema(base+"/output.schema.json", def.OutputSchema); err != nil {
			return def, fmt.Errorf("%w %s: output_schema: %w", envelope.ErrInvalidTool, def.Ref(), err)
		}
	}
	return def, nil
}

// Register adds a new tool version, active. Registering a version again with
// the same definition does nothing (created is false); with another
// definition it is ErrConflict, whatever the version's state: publish a new
// version instead, and older versions stay callable until blocked.
func (r *Registry) Register(ctx context.Context, def envelope.ToolDefinition) (created bool, err error) {
	return r.RegisterAs(ctx, def, "")
}

// RegisterAs is Register by who (Entry.UpdatedBy).
func (r *Registry) RegisterAs(ctx context.Context, def envelope.ToolDefinition, by string) (created bool, err error) {
	return r.register(ctx, def, StateActive, by)
}

// RegisterDraftAs registers a new version as a draft, by who: listed to
// admins, refused at run time, until Publish. Until then a draft may be
// registered again with another definition, which replaces it (a published
// version never changes).
func (r *Registry) RegisterDraftAs(ctx context.Context, def envelope.ToolDefinition, by string) (created bool, err error) {
	return r.register(ctx, def, StateDraft, by)
}

// ErrNotDraft is Publish's error for a version that is not a draft.
var ErrNotDraft = errors.New("not a draft")

// Publish makes draft version ref active, by who: from now on it runs and
// every tenant's catalog lists it, and its definition is fixed.
func (r *Registry) Publish(ctx context.Context, ref envelope.ToolRef, by string) error {
	for range maxUpdateAttempts {
		kve, err := r.kv.Get(ctx, Key(ref))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("%w: %s", ErrNotFound, ref)
		}
		if err != nil {
			return fmt.Errorf("publish %s: %w", ref, err)
		}
		e, err := decode(kve.Value())
		if err != nil {
			return err
		}
		if e.State != StateDraft {
			return fmt.Errorf("publish %s: %w: it is %s", ref, ErrNotDraft, e.State)
		}
		e.State, e.UpdatedAt, e.UpdatedBy = StateActive, time.Now().UTC(), by
		b, err := json.Marshal(e)
		if err != nil {
			return err
		}
		if _, err = r.kv.Update(ctx, Key(ref), b, kve.Revision()); err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return fmt.Errorf("publish %s: %w", ref, err)
		}
	}
	return fmt.Errorf("publish %s: the entry kept changing", ref)
}

// maxUpdateAttempts bounds the compare-and-set retries of one change.
const maxUpdateAttempts = 16

func (r *Registry) register(ctx context.Context, def envelope.ToolDefinition, st State, by string) (created bool, err error) {
	if err := def.Validate(); err != nil {
		return false, err
	}
	b, err := json.Marshal(Entry{Definition: def, State: st, UpdatedAt: time.Now().UTC(), UpdatedBy: by})
	if err != nil {
		return false, err
	}
	_, err = r.kv.Create(ctx, Key(def.Ref()), b)
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return false, fmt.Errorf("register %s: %w", def.Ref(), err)
	}
	cur, err := r.Get(ctx, def.Ref())
	if err != nil {
		return false, err
	}
	if SameDefinition(cur.Definition, def) {
		return false, nil
	}
	if cur.State == StateDraft && st == StateDraft {
		// A draft is still under review: the new definition replaces it.
		cur.Definition, cur.UpdatedAt, cur.UpdatedBy = def, time.Time{}, by
		return false, r.Put(ctx, cur)
	}
	return false, fmt.Errorf("%w: %s (state %s); register the change as a new version", ErrConflict, def.Ref(), cur.State)
}

// SameDefinition reports whether two definitions are equal as JSON (schema
// documents compared by meaning, not by spelling).
func SameDefinition(a, b envelope.ToolDefinition) bool {
	ja, errA := envelope.Canonicalize(mustJSON(a))
	jb, errB := envelope.Canonicalize(mustJSON(b))
	return errA == nil && errB == nil && bytes.Equal(ja, jb)
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// Filter selects registry entries, as `toolwire tools list` and the tool
// catalog do. Zero fields select everything.
type Filter struct {
	// Search matches a substring of the name or the description, ignoring
	// case.
	Search string
	// Category keeps one category.
	Category envelope.Category
	// States keeps these states.
	States []State
}

// Match reports whether e is selected.
func (f Filter) Match(e Entry) bool {
	if f.Category != "" && e.Definition.Metadata.Category != f.Category {
		return false
	}
	if len(f.States) > 0 && !slices.Contains(f.States, e.State) {
		return false
	}
	if q := strings.ToLower(strings.TrimSpace(f.Search)); q != "" {
		return strings.Contains(strings.ToLower(e.Definition.Name), q) ||
			strings.Contains(strings.ToLower(e.Definition.Description), q)
	}
	return true
}

// Select returns the entries f selects, in their order.
func Select(entries []Entry, f Filter) []Entry {
	out := make([]Entry, 0, len(entries))
	for _, e := range entries {
		if f.Match(e) {
			out = append(out, e)
		}
	}
	return out
}

// Findings are what a check of an agent's enabled tools found: warnings
// (deprecated versions: still callable) and problems (unknown or blocked
// versions, malformed references: the configuration cannot run).
type Findings struct {
	Warnings []string `json:"warnings"`
	Problems []string `json:"problems"`
}

// CheckTools checks enabled tool references (name@version) against the
// registry, as the orchestrator does when a run starts (docs/policy.md,
// Registry: deprecated warns, blocked is refused). An entry whose definition
// breaks the rules that registration checks now (one stored before, such as an
// http tool without a valid endpoint) is a problem too: its calls cannot run.
func CheckTools(lookup func(envelope.ToolRef) (Entry, bool), enabled []string) Findings {
	f := Findings{Warnings: []string{}, Problems: []string{}}
	for _, s := range enabled {
		ref, err := envelope.ParseToolRef(s)
		if err != nil {
			f.Problems = append(f.Problems, err.Error())
			continue
		}
		e, ok := lookup(ref)
		switch {
		case !ok:
			f.Problems = append(f.Problems, "unknown tool "+ref.String())
		case e.State == StateBlocked:
			f.Problems = append(f.Problems, "tool "+ref.String()+" is blocked")
		case e.State == StateDraft:
			f.Problems = append(f.Problems, "tool "+ref.String()+" is a draft: publish it first (toolwire tools publish "+ref.String()+")")
		case e.State == StateDeprecated:
			f.Warnings = append(f.Warnings, "tool "+ref.String()+" is deprecated")
		case e.State != StateActive:
			f.Problems = append(f.Problems, fmt.Sprintf("tool %s has unknown registry state %q", ref, e.State))
		}
		if ok && e.State.Executable() {
			if err := e.Definition.Validate(); err != nil {
				f.Problems = append(f.Problems, fmt.Sprintf("tool %s cannot run: %v", ref, err))
			}
		}
	}
	return f
}

// LookupIn is a lookup over a list of entries (for example from List).
func LookupIn(entries []Entry) func(envelope.ToolRef) (Entry, bool) {
	m := make(map[string]Entry, len(entries))
	for _, e := range entries {
		m[Key(e.Definition.Ref())] = e
	}
	return func(ref envelope.ToolRef) (Entry, bool) {
		e, ok := m[Key(ref)]
		return e, ok
	}
}
