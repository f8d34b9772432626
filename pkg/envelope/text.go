package envelope

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Bounds of the text fields of a run request.
const (
	// MaxNameBytes bounds an identifier-like field: a tenant id, an agent or
	// model name, a scope, a metadata key.
	MaxNameBytes = 256
	// MaxMetadataValueBytes bounds one metadata value.
	MaxMetadataValueBytes = 4096
)

// nameProblem says what is wrong with an identifier-like text field, or "".
// Such a field names something: it ends up in subjects' extensions, span
// attributes, log lines and the recorder's text columns, where a control
// character (NUL above all: no Postgres text column can hold it) or invalid
// UTF-8 either breaks the write or forges a line.
func nameProblem(field, s string, maxBytes int) string {
	if len(s) > maxBytes {
		return fmt.Sprintf("%s is %d bytes, more than %d", field, len(s), maxBytes)
	}
	if !utf8.ValidString(s) {
		return fmt.Sprintf("%s is not valid UTF-8", field)
	}
	for i, r := range s {
		switch {
		case unicode.IsControl(r):
			return fmt.Sprintf("%s holds the control character %U at byte %d", field, r, i)
		case isFormatControl(r):
			return fmt.Sprintf("%s holds the invisible formatting character %U at byte %d", field, r, i)
		case r == utf8.RuneError:
			return fmt.Sprintf("%s holds %U (text that was not valid UTF-8) at byte %d", field, r, i)
		}
	}
	return ""
}

// textProblem says what is wrong with a free text field (a prompt, a
// message), or "": it may hold line breaks and tabs, but no NUL or other C0/C1
// control, and must be valid UTF-8.
func textProblem(field, s string) string {
	if !utf8.ValidString(s) {
		return fmt.Sprintf("%s is not valid UTF-8", field)
	}
	for i, r := range s {
		if r == '\n' || r == '\r' || r == '\t' {
			continue
		}
		if unicode.IsControl(r) {
			return fmt.Sprintf("%s holds the control character %U at byte %d", field, r, i)
		}
	}
	return ""
}

// isFormatControl reports the invisible characters that reorder or hide text
// (bidirectional overrides and isolates, zero-width marks): harmless in a
// prompt, a way to make one name look like another in a name.
func isFormatControl(r rune) bool {
	return r >= 0x200B && r <= 0x200F || r >= 0x202A && r <= 0x202E || r >= 0x2066 && r <= 0x2069 || r == 0xFEFF
}

// textProblems checks every text field of the request: names strictly, free
// text for control characters.
func (r *RunRequest) textProblems() []string {
	var out []string
	name := func(field, s string, maxBytes int) {
		if p := nameProblem(field, s, maxBytes); p != "" {
			out = append(out, p)
		}
	}
	text := func(field, s string) {
		if p := textProblem(field, s); p != "" {
			out = append(out, p)
		}
	}
	name("tenant.org_id", r.Tenant.OrgID, MaxNameBytes)
	name("tenant.workspace_id", r.Tenant.WorkspaceID, MaxNameBytes)
	name("tenant.user_id", r.Tenant.UserID, MaxNameBytes)
	a := &r.Agent
	name("agent.name", a.Name, MaxNameBytes)
	name("agent.model.provider", a.Model.Provider, MaxNameBytes)
	name("agent.model.name", a.Model.Name, MaxNameBytes)
	text("agent.system_prompt", a.SystemPrompt)
	for i, s := range a.Policy.Scopes {
		name(fmt.Sprintf("agent.policy.scopes[%d]", i), s, MaxNameBytes)
	}
	for k, v := range r.Metadata {
		name("metadata key", k, MaxNameBytes)
		if p := nameProblem("metadata["+k+"]", v, MaxMetadataValueBytes); p != "" && utf8.ValidString(k) {
			out = append(out, p)
		}
	}
	for i, m := range r.Messages {
		at := fmt.Sprintf("messages[%d]", i)
		text(at+".content", m.Content)
		name(at+".name", m.Name, MaxNameBytes)
		name(at+".tool_call_id", m.ToolCallID, MaxNameBytes)
		for j, c := range m.ToolCalls {
			name(fmt.Sprintf("%s.tool_calls[%d].id", at, j), c.ID, MaxNameBytes)
			name(fmt.Sprintf("%s.tool_calls[%d].name", at, j), c.Name, MaxNameBytes)
		}
	}
	return out
}

// ValidateName checks an identifier-like text field (a tenant id, an agent's
// name) as RunRequest.Validate does: no control characters, no invalid
// UTF-8, no invisible reordering marks, at most MaxNameBytes.
func ValidateName(field, s string) error {
	if p := nameProblem(field, s, MaxNameBytes); p != "" {
		return fmt.Errorf("%w: %s", ErrInvalidRequest, p)
	}
	return nil
}
