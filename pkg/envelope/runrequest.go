package envelope

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Default policy caps (docs/policy.md, Guard).
const (
	DefaultMaxIterations = 10
	DefaultMaxToolCalls  = 25
)

// isRunID reports whether id is 1 to 64 letters, digits, '-' or '_'. It is
// checked on every event a service handles, so it is a loop, not a regexp.
func isRunID(id string) bool { return IsToken(id, 64, isWordByte) }

// IsToken reports whether s is 1 to max bytes, each accepted by ok. Ids are
// checked on every event a service handles, so this is a loop, not a regexp.
func IsToken(s string, max int, ok func(byte) bool) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !ok(s[i]) {
			return false
		}
	}
	return true
}

// isWordByte accepts ASCII letters, digits, '-' and '_'.
func isWordByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// ValidateRunID checks that id is a single safe NATS subject token: 1 to 64
// letters, digits, '-' or '_'. Anything else could escape its subject.
func ValidateRunID(id string) error {
	if !isRunID(id) {
		return fmt.Errorf("%w: run_id %q must be 1-64 letters, digits, '-' or '_'", ErrInvalidRequest, truncateForError(id))
	}
	return nil
}

func truncateForError(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// Tenant identifies who a run belongs to. Secrets resolve user, then workspace,
// then org; the cache is scoped by the whole tuple.
type Tenant struct {
	OrgID       string `json:"org_id"`
	WorkspaceID string `json:"workspace_id,omitempty"`
	UserID      string `json:"user_id,omitempty"`
}

// ID is the tenant's single string id, "org/workspace/user", used for the
// CloudEvents tenantid extension and to scope caches.
func (t Tenant) ID() string { return t.OrgID + "/" + t.WorkspaceID + "/" + t.UserID }

// Policy is the Policy Guard configuration of an agent node (docs/policy.md,
// Guard). Zero values mean the defaults.
type Policy struct {
	MaxIterations int         `json:"max_iterations,omitempty"`
	MaxToolCalls  int         `json:"max_tool_calls,omitempty"`
	MaxBudget     float64     `json:"max_budget,omitempty"`
	SideEffects   SideEffects `json:"side_effects,omitempty"`
	Scopes        []string    `json:"scopes,omitempty"`
	// RequireApproval names the tool calls that wait for an operator's
	// decision before they run (see ApprovalPolicy).
	RequireApproval *ApprovalPolicy `json:"require_approval,omitempty"`
	// ApprovalTimeoutS is how long a call waits for that decision; none in
	// time is a denial. Zero means DefaultApprovalTimeout.
	ApprovalTimeoutS int `json:"approval_timeout_s,omitempty"`
	// Autonomy is the agent node's row of the gate matrix (docs/policy.md,
	// Gates); empty: autonomous.
	Autonomy Autonomy `json:"autonomy,omitempty"`
}

// Iterations is MaxIterations or its default.
func (p Policy) Iterations() int {
	if p.MaxIterations > 0 {
		return p.MaxIterations
	}
	return DefaultMaxIterations
}

// ToolCalls is MaxToolCalls or its default.
func (p Policy) ToolCalls() int {
	if p.MaxToolCalls > 0 {
		return p.MaxToolCalls
	}
	return DefaultMaxToolCalls
}

// SideEffectCeiling is SideEffects or, when unset, writes (everything allowed).
func (p Policy) SideEffectCeiling() SideEffects {
	if p.SideEffects == "" {
		return SideEffectsWrites
	}
	return p.SideEffects
}

// Model selects the LLM and its settings. Options are provider specific; the
// scripted provider reads its script from them.
type Model struct {
	Provider    string          `json:"provider"`
	Name        string          `json:"name"`
	Temperature *float64        `json:"temperature,omitempty"`
	MaxTokens   int             `json:"max_tokens,omitempty"`
	Options     json.RawMessage `json:"options,omitempty"`
}

// Agent is the configuration of an agent node.
type Agent struct {
	Name          string         `json:"name"`
	Model         Model          `json:"model"`
	SystemPrompt  string         `json:"system_prompt,omitempty"`
	EnabledTools  []string       `json:"enabled_tools"`
	Policy        Policy         `json:"policy"`
	PinnedHandles []PinnedHandle `json:"pinned_handles,omitempty"`

	// The model side (modelside.go). Stream publishes the model's answers
	// as they arrive, to watchers of the run (pkg/events/delta.go); off by
	// default.
	Stream bool `json:"stream,omitempty"`
	// ToolChoice: auto (default), required, none, or an enabled tool's
	// name; it applies to the first model call (ToolChoiceAt).
	ToolChoice string `json:"tool_choice,omitempty"`
	// ParallelToolCalls lets the model call several tools in one answer
	// (nil: the provider's default, which allows it).
	ParallelToolCalls *bool `json:"parallel_tool_calls,omitempty"`
	// StopAtTools end the run at the first successful call of one of these
	// enabled tools: its output is the answer.
	StopAtTools []string `json:"stop_at_tools,omitempty"`
	// OutputSchema is the JSON Schema of the final answer: the answer must
	// be one JSON value it accepts, else it goes back to the model with
	// the problems, at most OutputRetries times (0: DefaultOutputRetries;
	// -1: none), then the run fails. The value is AgentOutputs.Output.
	OutputSchema  json.RawMessage `json:"output_schema,omitempty"`
	OutputRetries int             `json:"output_retries,omitempty"`
}

// EnabledRefs parses EnabledTools.
func (a Agent) EnabledRefs() ([]ToolRef, error) {
	refs := make([]ToolRef, 0, len(a.EnabledTools))
	for _, s := range a.EnabledTools {
		r, err := ParseToolRef(s)
		if err != nil {
			return nil, err
		}
		refs = append(refs, r)
	}
	return refs, nil
}

// Role of a conversation message.
type Role string

// Message roles.
const (
	RoleSystem    Role = "system"
	RoleUser      Role = "user"
	RoleAssistant Role = "assistant"
	RoleTool      Role = "tool"
)

// ToolCall is one tool call proposed by the model. ID is the provider's id for
// the call (used to pair results with calls); Name is the tool's bare name.
type ToolCall struct {
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// Message is one message of the conversation in toolwire's provider-neutral form.
type Message struct {
	Role       Role       `json:"role"`
	Content    string     `json:"content,omitempty"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
	Name       string     `json:"name,omitempty"`
	// IsError marks a tool message whose call failed: Content then carries
	// the error (code, message, retry_after_s) for the model to act on.
	IsError bool `json:"is_error,omitempty"`
}

// RunRequest asks toolwire to run an agent node once.
type RunRequest struct {
	RunID    string            `json:"run_id"`
	Tenant   Tenant            `json:"tenant"`
	Agent    Agent             `json:"agent"`
	Messages []Message         `json:"messages"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// DeadlineS is how many seconds the run may take from its request
	// (1 to MaxDeadlineS); 0: the server's default (the orchestrator's
	// TOOLWIRE_RUN_DEADLINE). A run still going at its deadline ends
	// failed with code TIMEOUT and what it was waiting for.
	DeadlineS int `json:"deadline_s,omitempty"`
}

// MaxDeadlineS is the longest deadline a run request may ask for: a day.
const MaxDeadlineS = 24 * 60 * 60

// Validate checks what the JSON Schema cannot: it gathers every problem into one
// error wrapping ErrInvalidRequest.
func (r *RunRequest) Validate() error {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if !isRunID(r.RunID) {
		add("run_id %q must be 1-64 letters, digits, '-' or '_'", truncateForError(r.RunID))
	}
	if strings.TrimSpace(r.Tenant.OrgID) == "" {
		add("tenant.org_id is required")
	}
	if strings.TrimSpace(r.Agent.Name) == "" {
		add("agent.name is required")
	}
	if r.Agent.Model.Provider == "" {
		add("agent.model.provider is required")
	}
	names := map[string]string{}
	for i, s := range r.Agent.EnabledTools {
		ref, err := ParseToolRef(s)
		if err != nil {
			add("agent.enabled_tools[%d]: %v", i, err)
			continue
		}
		if prev, dup := names[ref.Name]; dup {
			add("agent.enabled_tools: %s and %s name the same tool; enable one version", prev, s)
		}
		names[ref.Name] = s
	}
	problems = append(problems, r.Agent.modelSideProblems(names)...)
	p := r.Agent.Policy
	if p.MaxIterations < 0 || p.MaxToolCalls < 0 || p.MaxBudget < 0 {
		add("agent.policy caps must not be negative")
	}
	if p.SideEffects != "" && p.SideEffects.Rank() < 0 {
		add("agent.policy.side_effects %q is not one of none, reads, writes", p.SideEffects)
	}
	if !p.Autonomy.Valid() {
		add("agent.policy.autonomy %q is not one of manual, supervised, autonomous", p.Autonomy)
	}
	for _, problem := range p.guardProblems() {
		add("agent.policy.%s", problem)
	}
	pinNames := map[string]bool{}
	for i, pin := range r.Agent.PinnedHandles {
		if err := pin.Validate(); err != nil {
			add("agent.pinned_handles[%d]: %v", i, err)
		}
		if pinNames[pin.Name] {
			add("agent.pinned_handles: duplicate name %q", pin.Name)
		}
		pinNames[pin.Name] = true
	}
	if r.DeadlineS < 0 || r.DeadlineS > MaxDeadlineS {
		add("deadline_s %d must be 1 to %d seconds (0: the server's default)", r.DeadlineS, MaxDeadlineS)
	}
	if len(r.Messages) == 0 {
		add("messages must hold at least one message")
	}
	problems = append(problems, r.textProblems()...)
	for i, m := range r.Messages {
		switch m.Role {
		case RoleSystem, RoleUser, RoleAssistant, RoleTool:
		default:
			add("messages[%d].role %q is not one of system, user, assistant, tool", i, m.Role)
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidRequest, strings.Join(problems, "; "))
	}
	return nil
}
