package envelope

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"
)

// Approval timeouts of a Policy.
const (
	// DefaultApprovalTimeout is how long a call waits for an operator's
	// decision when the policy sets no approval_timeout_s.
	DefaultApprovalTimeout = 15 * time.Minute
	// MaxApprovalTimeoutS bounds Policy.ApprovalTimeoutS: one day.
	MaxApprovalTimeoutS = 24 * 60 * 60
)

// Limits of secret names and scopes.
const (
	maxScopeLen    = 128
	maxSecretNames = 32
	maxScopes      = 64
)

var secretNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// ValidateSecretName checks a secret's name: 1-64 letters, digits or '_', not
// starting with a digit (like an environment variable: OPENAI_API_KEY).
func ValidateSecretName(name string) error {
	if !secretNameRE.MatchString(name) {
		return fmt.Errorf("secret name %q must be 1-64 letters, digits or '_', not starting with a digit", truncateForError(name))
	}
	return nil
}

// ValidateScope checks a scope's name: 1-128 printable characters without
// spaces (for example "crm:write").
func ValidateScope(scope string) error {
	if scope == "" || len(scope) > maxScopeLen || strings.ContainsFunc(scope, func(r rune) bool {
		return unicode.IsSpace(r) || !unicode.IsPrint(r)
	}) {
		return fmt.Errorf("scope %q must be 1-%d printable characters without spaces", truncateForError(scope), maxScopeLen)
	}
	return nil
}

// validateRequirements checks a tool definition's required secrets and scopes.
func validateRequirements(secrets, scopes []string) []string {
	return append(checkList("required_secrets", "names", secrets, maxSecretNames, ValidateSecretName),
		checkList("required_scopes", "scopes", scopes, maxScopes, ValidateScope)...)
}

// checkList checks the list field of a definition: at most most items
// (counted as what), each one valid and none listed twice.
func checkList(field, what string, items []string, most int, valid func(string) error) []string {
	var problems []string
	if len(items) > most {
		problems = append(problems, fmt.Sprintf("%s holds %d %s; at most %d", field, len(items), what, most))
	}
	for i, item := range items {
		if err := valid(item); err != nil {
			problems = append(problems, fmt.Sprintf("%s[%d]: %v", field, i, err))
		} else if slices.Index(items, item) != i {
			problems = append(problems, fmt.Sprintf("%s[%d]: %q is listed twice", field, i, item))
		}
	}
	return problems
}

// ApprovalPolicy says which tool calls of a run wait for an operator's
// decision (approve, deny or revise) before they run.
type ApprovalPolicy struct {
	// Writes requires approval for every tool whose side_effects is writes.
	Writes bool `json:"writes,omitempty"`
	// Tools requires approval for the named tools: a bare name covers every
	// version, name@version one version.
	Tools []string `json:"tools,omitempty"`
}

// Requires reports whether a call of def needs approval under a, and why.
func (a *ApprovalPolicy) Requires(def *ToolDefinition) (bool, string) {
	if a == nil {
		return false, ""
	}
	ref := def.Ref()
	for _, t := range a.Tools {
		if t == ref.Name || t == ref.String() {
			return true, fmt.Sprintf("the policy requires approval for tool %s", t)
		}
	}
	if a.Writes && def.Metadata.SideEffects == SideEffectsWrites {
		return true, fmt.Sprintf("the policy requires approval for tools that write, and %s writes", ref)
	}
	return false, ""
}

// ApprovalTimeout is ApprovalTimeoutS or DefaultApprovalTimeout.
func (p Policy) ApprovalTimeout() time.Duration {
	if p.ApprovalTimeoutS > 0 {
		return time.Duration(p.ApprovalTimeoutS) * time.Second
	}
	return DefaultApprovalTimeout
}

// guardProblems checks the granted scopes and the approval settings.
func (p Policy) guardProblems() []string {
	var problems []string
	for i, s := range p.Scopes {
		if err := ValidateScope(s); err != nil {
			problems = append(problems, fmt.Sprintf("scopes[%d]: %v", i, err))
		}
	}
	if p.ApprovalTimeoutS < 0 || p.ApprovalTimeoutS > MaxApprovalTimeoutS {
		problems = append(problems, fmt.Sprintf("approval_timeout_s %d must be from 1 to %d (one day); 0 means %d",
			p.ApprovalTimeoutS, MaxApprovalTimeoutS, int(DefaultApprovalTimeout/time.Second)))
	}
	if p.RequireApproval != nil {
		for i, t := range p.RequireApproval.Tools {
			var err error
			if strings.Contains(t, "@") {
				_, err = ParseToolRef(t)
			} else if !isToolName(t) {
				err = fmt.Errorf("%q is neither a tool name nor name@version", truncateForError(t))
			}
			if err != nil {
				problems = append(problems, fmt.Sprintf("require_approval.tools[%d]: %v", i, err))
			}
		}
	}
	return problems
}
