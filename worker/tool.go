package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// The vocabulary of a tool definition, so that a program needs no other
// toolwire package than this one.
type (
	// Category is a tool's category for the tool selector.
	Category = envelope.Category
	// SideEffects is what a tool may change: the Policy Guard's side-effect
	// ceiling and approvals judge it, and a writes tool runs at most once per
	// call.
	SideEffects = envelope.SideEffects
	// CachePolicy says whether and how long a tool's successful outputs are
	// reused for the same input (per tenant).
	CachePolicy = envelope.CachePolicy
	// RateLimit is a token bucket per tenant and tool.
	RateLimit = envelope.RateLimit
	// RiskPolicy classifies a tool's calls for the gate matrix.
	RiskPolicy = envelope.RiskPolicy
	// Risk is a risk level: RiskLow, RiskMedium, RiskHigh, RiskCritical.
	Risk = envelope.Risk
)

// Risk levels.
const (
	RiskLow      = envelope.RiskLow
	RiskMedium   = envelope.RiskMedium
	RiskHigh     = envelope.RiskHigh
	RiskCritical = envelope.RiskCritical
)

// Categories, side effects and cache policies.
const (
	CategoryAPI     = envelope.CategoryAPI
	CategoryCode    = envelope.CategoryCode
	CategoryData    = envelope.CategoryData
	CategorySearch  = envelope.CategorySearch
	CategoryUtility = envelope.CategoryUtility

	SideEffectsNone   = envelope.SideEffectsNone
	SideEffectsReads  = envelope.SideEffectsReads
	SideEffectsWrites = envelope.SideEffectsWrites

	CacheNone    = envelope.CacheNone
	CacheTTL     = envelope.CacheTTL
	CacheForever = envelope.CacheForever
)

// Def declares a tool: what the model sees (name, version, description; the
// schemas come from the function's types) and what the Policy Guard and the
// executor enforce.
type Def struct {
	// Name is the function name the model calls: 1-64 letters, digits, '_'
	// or '-'.
	Name string
	// Version is a semantic version. A registered version's definition never
	// changes: change the tool, change the version.
	Version string
	// Description tells the model what the tool does and when to use it.
	Description string
	// Category; default CategoryUtility.
	Category Category
	// SideEffects must be declared: SideEffectsNone, SideEffectsReads or
	// SideEffectsWrites. There is no default, because a forgotten
	// declaration read as "none" would let a tool that writes past the
	// Policy Guard's side-effect ceiling and approvals.
	SideEffects SideEffects
	// Idempotent, for a SideEffectsWrites tool only, declares that the
	// tool's effects are safe to repeat under the call's idempotency key
	// (Call.IdempotencyKey, the same on every run of the call): a call
	// whose worker or executor died during it is then run again, on this
	// worker or another, instead of ending UNKNOWN (outcome unknown). Pass
	// the key to whatever your function writes to, so that it applies a
	// repeated request once.
	Idempotent bool
	// Cost is what one execution costs, in the unit of the model price
	// table (USD by default); it counts against a run's max_budget.
	Cost float64
	// Timeout bounds one call (its context ends then, and the call is a
	// TIMEOUT); default 30s. Whole milliseconds.
	Timeout time.Duration
	// Cache is the cache policy; default CacheNone. A writes tool cannot be
	// cached.
	Cache CachePolicy
	// CacheTTL is how long a cached output lives, with Cache CacheTTL;
	// whole seconds.
	CacheTTL time.Duration
	// RateLimit, when set, limits each tenant's calls to the tool.
	RateLimit *RateLimit
	// Secrets names the secrets the tool needs (`toolwire secrets set`):
	// resolved for the call's tenant into Call.Secrets; a missing one fails
	// the call with AUTH_REQUIRED before the function runs.
	Secrets []string
	// Scopes are the scopes a run must be granted to call the tool.
	Scopes []string
	// Risk classifies the tool's calls for the gate matrix (docs/policy.md,
	// Gates); nil: by its side effects.
	Risk *RiskPolicy
	// Queue is the queue the tool's calls are routed to; default
	// Config.Queue of the worker that serves it. Not "default": that queue
	// is the executor binary's, whose replicas do not have your function.
	Queue string
}

// Tool is a Go function declared as a tool, ready for a Worker. A Tool made
// from a bad declaration carries its error (Err), which the Worker reports
// before it serves anything.
type Tool struct {
	def     envelope.ToolDefinition
	run     func(ctx context.Context, input json.RawMessage) (json.RawMessage, error)
	preview func(ctx context.Context, input json.RawMessage) (json.RawMessage, error)
	err     error
}

// WithPreview gives t a dry run, fn: what a call with the input would do,
// changing nothing (the request it would send, the rows it would touch).
// The definition then declares supports_preview, and a call that waits for
// an operator's approval (the preview gate, docs/policy.md) carries what fn
// returns, encoded as JSON. fn gets the input as the tool's own function
// does, and the same context (CallOf, the timeout); it must not change
// anything.
func WithPreview[In any](t *Tool, fn func(ctx context.Context, in In) (any, error)) *Tool {
	if t.err != nil {
		return t
	}
	if fn == nil {
		t.err = fmt.Errorf("%w %s: no preview function", ErrInvalidTool, t.def.Ref())
		return t
	}
	t.def.SupportsPreview = true
	t.preview = func(ctx context.Context, input json.RawMessage) (json.RawMessage, error) {
		var in In
		if err := json.Unmarshal(input, &in); err != nil {
			return nil, envelope.NewToolError(envelope.CodeValidation, "input of tool %s does not fit its Go type: %v", t.def.Name, err)
		}
		out, err := fn(ctx, in)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(out)
		if err != nil {
			return nil, fmt.Errorf("tool %s: encode preview: %w", t.def.Name, err)
		}
		return b, nil
	}
	return t
}

// schemaDialect is the JSON Schema draft of the generated schemas, the one
// the executor validates with.
const schemaDialect = "https://json-schema.org/draft/2020-12/schema"

// Func declares fn as a tool. The input schema is derived from In, which must
// be a struct: its exported fields by their JSON names, required unless
// tagged omitempty or omitzero, no other properties allowed; a field's
// `jsonschema:"..."` tag is its description for the model. The output schema
// is derived from Out the same way (any type). The schemas are generated by
// github.com/google/jsonschema-go, the generator of the MCP Go SDK, so a
// tool's types mean the same here as in an MCP server.
//
// fn receives the input decoded into In, already valid against the schema,
// and a context that ends at the tool's timeout or when the worker stops;
// CallOf(ctx) tells which call it serves and carries its secrets.
func Func[In, Out any](d Def, fn func(ctx context.Context, in In) (Out, error)) *Tool {
	t := &Tool{}
	t.def, t.err = definition[In, Out](d)
	if t.err == nil && fn == nil {
		t.err = fmt.Errorf("%w %s: no function", ErrInvalidTool, t.def.Ref())
	}
	t.run = func(ctx context.Context, input json.RawMessage) (json.RawMessage, error) {
		var in In
		if err := json.Unmarshal(input, &in); err != nil {
			// The input matched the schema, so this is a type the schema
			// cannot say everything about (a number too large for an int8,
			// say): the model's mistake all the same.
			return nil, envelope.NewToolError(envelope.CodeValidation, "input of tool %s does not fit its Go type: %v", d.Name, err)
		}
		out, err := fn(ctx, in)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(out)
		if err != nil {
			return nil, fmt.Errorf("tool %s: encode output: %w", d.Name, err)
		}
		return b, nil
	}
	return t
}

// Definition returns the tool's registry definition (its queue still empty
// when neither the Def nor the Worker named one), or the error of its
// declaration.
func (t *Tool) Definition() (envelope.ToolDefinition, error) {
	return t.def, t.err
}

// Err is the error of the tool's declaration, nil when it is sound.
func (t *Tool) Err() error { return t.err }

// definition builds and checks the registry definition of a Def.
func definition[In, Out any](d Def) (envelope.ToolDefinition, error) {
	def := envelope.ToolDefinition{
		Name:        d.Name,
		Version:     d.Version,
		Description: d.Description,
		Metadata: envelope.ToolMetadata{
			Category:    d.Category,
			SideEffects: d.SideEffects,
			Cache:       d.Cache,
			Idempotent:  d.Idempotent,
		},
		RateLimit:       d.RateLimit,
		Risk:            d.Risk,
		Cost:            d.Cost,
		RequiredSecrets: append([]string(nil), d.Secrets...),
		RequiredScopes:  append([]string(nil), d.Scopes...),
		Queue:           d.Queue,
		// Run in process by the worker's executor, under a key no built-in
		// has (built-in keys hold no '@'), one per version.
		Implementation: toolapi.BuiltinImplementation(d.Name + "@" + d.Version),
	}
	if def.Metadata.Category == "" {
		def.Metadata.Category = envelope.CategoryUtility
	}
	if def.Metadata.Cache == "" {
		def.Metadata.Cache = envelope.CacheNone
	}
	var problems []error
	if d.SideEffects == "" {
		problems = append(problems, errors.New("side effects must be declared: SideEffectsNone, SideEffectsReads or SideEffectsWrites"))
	}
	if d.Timeout < 0 || d.Timeout%time.Millisecond != 0 || d.Timeout > math.MaxInt32*time.Millisecond {
		problems = append(problems, fmt.Errorf("timeout %s: want whole milliseconds, zero (30s) or more", d.Timeout))
	}
	def.TimeoutMS = int(d.Timeout / time.Millisecond)
	switch {
	case d.Cache == envelope.CacheTTL && (d.CacheTTL < time.Second || d.CacheTTL%time.Second != 0):
		problems = append(problems, fmt.Errorf("cache ttl %s: want whole seconds, at least 1s, with CacheTTL", d.CacheTTL))
	case d.Cache != envelope.CacheTTL && d.CacheTTL != 0:
		problems = append(problems, fmt.Errorf("cache ttl %s is set, but the cache policy is %q, not ttl", d.CacheTTL, def.Metadata.Cache))
	}
	def.Metadata.CacheTTLS = int(d.CacheTTL / time.Second)
	if d.Queue == envelope.DefaultQueue {
		problems = append(problems, errDefaultQueue)
	}

	in, err := schemaFor[In]()
	switch {
	case err != nil:
		problems = append(problems, fmt.Errorf("input type: %w", err))
	case in.Type != "object":
		var z In
		problems = append(problems, fmt.Errorf("input type %T: want a struct (a tool's input is a JSON object), not a pointer, map or other type", z))
	}
	if def.InputSchema, err = marshalSchema(in, err); err != nil {
		problems = append(problems, err)
	}
	out, err := schemaFor[Out]()
	if err != nil {
		problems = append(problems, fmt.Errorf("output type: %w", err))
	}
	if def.OutputSchema, err = marshalSchema(out, err); err != nil {
		problems = append(problems, err)
	}
	if len(problems) == 0 {
		if err := def.Validate(); err != nil {
			problems = append(problems, err)
		}
	}
	if len(problems) == 0 {
		// The schemas compile as the executor compiles them.
		if _, err := toolapi.CompileSchemas(&def); err != nil {
			problems = append(problems, err)
		}
	}
	if err := errors.Join(problems...); err != nil {
		return def, fmt.Errorf("%w %s: %w", ErrInvalidTool, def.Ref(), err)
	}
	return def, nil
}

func schemaFor[T any]() (*jsonschema.Schema, error) {
	s, err := jsonschema.For[T](nil)
	if err != nil {
		return nil, err
	}
	s.Schema = schemaDialect
	return s, nil
}

func marshalSchema(s *jsonschema.Schema, err error) (json.RawMessage, error) {
	if err != nil {
		return nil, nil //nolint:nilerr // reported by the caller
	}
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encode schema: %w", err)
	}
	return b, nil
}

// Call is what a tool's function learns about the call it serves.
type Call struct {
	TenantID string
	RunID    string
	CallID   string
	// Secrets holds the values of the secrets the tool declared, by name.
	// They are scrubbed from the output, errors and logs of the call, never
	// recorded: do not put them anywhere else.
	Secrets map[string]string
	// Log is the call's logger (run, call and tool attributes), scrubbed of
	// the secrets' values.
	Log *slog.Logger
}

// IdempotencyKey is the call's idempotency key, "<run_id>.<call_id>": the
// same on every run of the call, so that an endpoint given it applies a
// repeated request once (Def.Idempotent).
func (c Call) IdempotencyKey() string { return envelope.IdempotencyKey(c.RunID, c.CallID) }

type callKey struct{}

// CallOf returns the call a tool's function serves, from its context; a
// context of no call gives the zero Call, with a logger that discards.
func CallOf(ctx context.Context) Call {
	if c, ok := ctx.Value(callKey{}).(Call); ok {
		return c
	}
	return Call{Log: slog.New(slog.DiscardHandler)}
}
