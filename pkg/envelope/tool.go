package envelope

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"strings"
	"time"
)

// Category is a tool's high-level category for the tool selector.
type Category string

// Categories (docs/architecture.md, Contracts: the tool definition).
const (
	CategoryAPI     Category = "api"
	CategoryCode    Category = "code"
	CategoryData    Category = "data"
	CategorySearch  Category = "search"
	CategoryUtility Category = "utility"
)

// SideEffects is a tool's security manifest for the Policy Guard. The values are
// ordered: none < reads < writes.
type SideEffects string

// Side-effect classes (docs/architecture.md, Contracts: the tool definition).
const (
	SideEffectsNone   SideEffects = "none"
	SideEffectsReads  SideEffects = "reads"
	SideEffectsWrites SideEffects = "writes"
)

// Rank orders side effects: none 0, reads 1, writes 2, anything else -1.
func (s SideEffects) Rank() int {
	switch s {
	case SideEffectsNone:
		return 0
	case SideEffectsReads:
		return 1
	case SideEffectsWrites:
		return 2
	}
	return -1
}

// CachePolicy is a tool's caching policy.
type CachePolicy string

// Cache policies (docs/architecture.md, Contracts: the tool definition).
const (
	CacheNone    CachePolicy = "none"
	CacheTTL     CachePolicy = "ttl"
	CacheForever CachePolicy = "forever"
)

// ImplementationKind says which runtime executes a tool.
type ImplementationKind string

// Implementation kinds.
const (
	ImplBuiltin ImplementationKind = "builtin" // compiled into the executor
	ImplHTTP    ImplementationKind = "http"    // an HTTP endpoint (config: HTTPConfig)
	ImplMCP     ImplementationKind = "mcp"     // a tool of an MCP server
	ImplSandbox ImplementationKind = "sandbox" // code run by the sandbox service
)

// DefaultToolTimeout applies when a definition sets no timeout.
const DefaultToolTimeout = 30 * time.Second

// Implementation says how a tool runs; Config is interpreted by its runtime.
type Implementation struct {
	Kind   ImplementationKind `json:"kind"`
	Config json.RawMessage    `json:"config,omitempty"`
}

// ToolMetadata is a tool definition's metadata (docs/architecture.md,
// Contracts).
type ToolMetadata struct {
	Category    Category    `json:"category"`
	SideEffects SideEffects `json:"side_effects"`
	Cache       CachePolicy `json:"cache"`
	CacheTTLS   int         `json:"cache_ttl_s,omitempty"`
	// Idempotent declares that a writes tool's effects are safe to repeat
	// under the call's idempotency key (IdempotencyKey: an http tool sends
	// it as Idempotency-Key; a builtin or worker tool derives it from the
	// call's run and call ids): a call whose executor died during the call
	// is run again with the same key instead of ending UNKNOWN. Only a
	// writes tool may declare it; the others are run again anyway.
	Idempotent bool `json:"idempotent,omitempty"`
}

// ToolDefinition is a registry entry: the BaseTool interface's data (name,
// version, schemas, metadata) plus what the executor needs to run it.
type ToolDefinition struct {
	Name           string          `json:"name"`
	Version        string          `json:"version"`
	Description    string          `json:"description,omitempty"`
	InputSchema    json.RawMessage `json:"input_schema"`
	OutputSchema   json.RawMessage `json:"output_schema,omitempty"`
	Metadata       ToolMetadata    `json:"metadata"`
	TimeoutMS      int             `json:"timeout_ms,omitempty"`
	Implementation Implementation  `json:"implementation"`
	// RateLimit, when set, limits the calls of each tenant to this tool.
	RateLimit *RateLimit `json:"rate_limit,omitempty"`
	// Cost is what one execution of the tool costs, in the unit of the model
	// price table (USD by default); it accrues to the run's spend and counts
	// against the policy's max_budget. Zero: free.
	Cost float64 `json:"cost,omitempty"`
	// RequiredSecrets names the secrets the tool needs. The executor resolves
	// each for the call's tenant (user, then workspace, then org scope) into
	// ToolContext.Auth; a missing one fails the call with AUTH_REQUIRED.
	RequiredSecrets []string `json:"required_secrets,omitempty"`
	// SecretDestinations binds secrets of RequiredSecrets to where they may
	// be sent: a web tool (a version of http_request or http_get) sends a
	// secret only to the hosts, and in the headers, of its binding, and
	// refuses a secret that has none with POLICY_DENIED. An http tool has
	// none: its secrets go to its endpoint alone.
	SecretDestinations map[string]SecretBinding `json:"secret_destinations,omitempty"`
	// RequiredScopes are the scopes a run must be granted (Policy.Scopes) to
	// call the tool; the Policy Guard refuses the call otherwise.
	RequiredScopes []string `json:"required_scopes,omitempty"`
	// SupportsPreview says the tool can do a dry run that changes nothing: an
	// approval request for one of its calls then carries the preview.
	SupportsPreview bool `json:"supports_preview,omitempty"`
	// Risk classifies its calls for the gate matrix (docs/policy.md,
	// Gates); nil: by its side effects.
	Risk *RiskPolicy `json:"risk,omitempty"`
	// Queue names the task queue whose workers run the tool; empty means
	// DefaultQueue, which the executor binary serves. The Policy Guard routes
	// each approved call to its tool's queue (toolwire.call.<run>.<call>.
	// approved.<queue>), so only the workers that have the tool receive it.
	Queue string `json:"queue,omitempty"`
}

// ToolState is a tool version's lifecycle state in the registry
// (docs/policy.md, Registry).
type ToolState string

// Lifecycle states.
const (
	ToolActive     ToolState = "active"     // discoverable and executable
	ToolDeprecated ToolState = "deprecated" // hidden by default, warned about, still executable
	ToolBlocked    ToolState = "blocked"    // refused at run time with POLICY_DENIED
	// ToolDraft is a version registered for review: listed to admins only,
	// refused at run time until it is published (made active).
	ToolDraft ToolState = "draft"
)

// Valid reports whether s is a known state.
func (s ToolState) Valid() bool {
	return s == ToolActive || s == ToolDeprecated || s == ToolBlocked || s == ToolDraft
}

// Executable reports whether a version in state s may run: active or
// deprecated.
func (s ToolState) Executable() bool { return s == ToolActive || s == ToolDeprecated }

// DefaultQueue is the queue of a tool that names none: the executor binary's.
const DefaultQueue = "default"

// QueueName is the tool's queue, DefaultQueue when it names none.
func (d *ToolDefinition) QueueName() string {
	if d.Queue == "" {
		return DefaultQueue
	}
	return d.Queue
}

// ValidateQueue checks that q is a queue name: 1 to 64 lowercase letters,
// digits, '-' or '_' (it is one token of a subject).
func ValidateQueue(q string) error {
	if !IsToken(q, 64, func(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' }) {
		return fmt.Errorf("queue %q must be 1-64 lowercase letters, digits, '-' or '_'", truncateForError(q))
	}
	return nil
}

// Ref returns the tool's "name@version".
func (d *ToolDefinition) Ref() ToolRef { return ToolRef{Name: d.Name, Version: d.Version} }

// RetriesWrites reports whether a call of the tool whose executor died
// during it may be run again with the same idempotency key: a writes tool
// that declares metadata.idempotent.
func (d *ToolDefinition) RetriesWrites() bool {
	return d.Metadata.SideEffects == SideEffectsWrites && d.Metadata.Idempotent
}

// Timeout is the tool's timeout, DefaultToolTimeout when unset.
func (d *ToolDefinition) Timeout() time.Duration {
	if d.TimeoutMS <= 0 {
		return DefaultToolTimeout
	}
	return time.Duration(d.TimeoutMS) * time.Millisecond
}

// Validate checks the definition's fields; the JSON Schemas themselves are
// compiled by the services that use them.
func (d *ToolDefinition) Validate() error {
	if err := d.Ref().Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidTool, err)
	}
	var problems []string
	if len(d.InputSchema) == 0 || !json.Valid(d.InputSchema) {
		problems = append(problems, "input_schema must be a JSON Schema object")
	}
	if len(d.OutputSchema) > 0 && !json.Valid(d.OutputSchema) {
		problems = append(problems, "output_schema is not valid JSON")
	}
	switch d.Metadata.Category {
	case CategoryAPI, CategoryCode, CategoryData, CategorySearch, CategoryUtility:
	default:
		problems = append(problems, fmt.Sprintf("metadata.category %q is not one of api, code, data, search, utility", d.Metadata.Category))
	}
	if d.Metadata.SideEffects.Rank() < 0 {
		problems = append(problems, fmt.Sprintf("metadata.side_effects %q is not one of none, reads, writes", d.Metadata.SideEffects))
	}
	switch d.Metadata.Cache {
	case CacheNone, CacheForever:
	case CacheTTL:
		if d.Metadata.CacheTTLS <= 0 {
			problems = append(problems, "metadata.cache_ttl_s must be positive when cache is ttl")
		}
	default:
		problems = append(problems, fmt.Sprintf("metadata.cache %q is not one of none, ttl, forever", d.Metadata.Cache))
	}
	if d.Metadata.Cache != CacheNone && d.Metadata.SideEffects == SideEffectsWrites {
		problems = append(problems, "a tool whose side_effects is writes cannot be cached")
	}
	if d.Metadata.Idempotent && d.Metadata.SideEffects != SideEffectsWrites {
		problems = append(problems, fmt.Sprintf("metadata.idempotent is only for a tool whose side_effects is writes, not %q: the executor runs a call of any other tool again on redelivery anyway", d.Metadata.SideEffects))
	}
	if d.TimeoutMS < 0 {
		problems = append(problems, "timeout_ms must not be negative")
	}
	if d.Cost < 0 || math.IsNaN(d.Cost) || math.IsInf(d.Cost, 0) {
		problems = append(problems, "cost must be a finite number, zero or more")
	}
	if d.Risk != nil {
		if err := d.Risk.Validate(); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if d.RateLimit != nil {
		if err := d.RateLimit.Validate(); err != nil {
			problems = append(problems, err.Error())
		}
	}
	problems = append(problems, validateRequirements(d.RequiredSecrets, d.RequiredScopes)...)
	problems = append(problems, secretBindingProblems(d)...)
	if d.Queue != "" {
		if err := ValidateQueue(d.Queue); err != nil {
			problems = append(problems, err.Error())
		}
	}
	switch d.Implementation.Kind {
	case ImplHTTP:
		// Nothing registrable may be unrunnable: an endpoint the executor
		// cannot call is refused here, not at the first call.
		if _, err := d.HTTPConfig(); err != nil {
			problems = append(problems, err.Error())
		}
	case ImplBuiltin, ImplMCP, ImplSandbox:
	default:
		problems = append(problems, fmt.Sprintf("implementation.kind %q is not one of builtin, http, mcp, sandbox", d.Implementation.Kind))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w %s: %s", ErrInvalidTool, d.Ref(), strings.Join(problems, "; "))
	}
	return nil
}

var (
	toolVersionRE = regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$`)
)

// ToolRef names one version of a tool: "name@version".
//
// Names are what LLM providers accept as function names (letters, digits, '_'
// and '-', at most 64); versions are semantic versions without build metadata.
type ToolRef struct {
	Name    string
	Version string
}

// ParseToolRef parses "name@version".
func ParseToolRef(s string) (ToolRef, error) {
	name, version, ok := strings.Cut(s, "@")
	if !ok {
		return ToolRef{}, fmt.Errorf("%w %q: want name@version", ErrInvalidToolRef, s)
	}
	r := ToolRef{Name: name, Version: version}
	return r, r.Validate()
}

// Validate checks the name and version.
func (r ToolRef) Validate() error {
	if !isToolName(r.Name) {
		return fmt.Errorf("%w %q: name must be 1-64 letters, digits, '_' or '-'", ErrInvalidToolRef, r.String())
	}
	if !toolVersionRE.MatchString(r.Version) {
		return fmt.Errorf("%w %q: version must be a semantic version like 1.2.0", ErrInvalidToolRef, r.String())
	}
	return nil
}

// String returns "name@version".
func (r ToolRef) String() string { return r.Name + "@" + r.Version }

// MarshalText implements encoding.TextMarshaler.
func (r ToolRef) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (r *ToolRef) UnmarshalText(b []byte) error {
	p, err := ParseToolRef(string(b))
	if err != nil {
		return err
	}
	*r = p
	return nil
}

// isToolName reports whether name is 1 to 64 letters, digits, '-' or '_'.
func isToolName(name string) bool { return IsToken(name, 64, isWordByte) }
