package events

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Subject prefixes and stream names (DESIGN.md).
const (
	Prefix = "toolwire"

	StreamRuns    = "TOOLWIRE_RUNS"
	StreamCalls   = "TOOLWIRE_CALLS"
	StreamSandbox = "TOOLWIRE_SANDBOX"
	StreamDLQ     = "TOOLWIRE_DLQ"

	SubjectsRuns    = Prefix + ".run.>"
	SubjectsCalls   = Prefix + ".call.>"
	SubjectsSandbox = Prefix + ".sandbox.>"
	SubjectsDLQ     = Prefix + ".dlq.>"
)

// ErrUnsafeID is wrapped when a run id or call id is not a safe subject token.
var ErrUnsafeID = errors.New("unsafe subject token")

// validateVerb checks that a subject's verb is one plain token (requested,
// approval_required, ...), never a wildcard or several tokens.
func validateVerb(verb Verb) error {
	if !envelope.IsToken(string(verb), 32, func(c byte) bool { return c >= 'a' && c <= 'z' || c == '_' }) {
		return fmt.Errorf("subject verb %q must be 1-32 lowercase letters or '_'", verb)
	}
	return nil
}

// ValidateRunID checks that id is one safe subject token: 1-64 letters, digits,
// '-' or '_'.
func ValidateRunID(id string) error {
	if err := envelope.ValidateRunID(id); err != nil {
		return fmt.Errorf("%w: %w", ErrUnsafeID, err)
	}
	return nil
}

// ValidateCallID checks that id is lowercase hex of at most 64 digits.
func ValidateCallID(id string) error {
	if !envelope.IsToken(id, 64, func(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' }) {
		if len(id) > 80 {
			id = id[:80] + "..."
		}
		return fmt.Errorf("%w: call_id %q must be lowercase hex, at most 64 digits", ErrUnsafeID, id)
	}
	return nil
}

func runSubject(runID string, verb Verb, middle ...string) (string, error) {
	if err := ValidateRunID(runID); err != nil {
		return "", err
	}
	if err := validateVerb(verb); err != nil {
		return "", err
	}
	return Prefix + ".run." + runID + "." + strings.Join(append(middle, string(verb)), "."), nil
}

func callSubject(prefix, runID, callID string, verb Verb) (string, error) {
	if err := ValidateRunID(runID); err != nil {
		return "", err
	}
	if err := ValidateCallID(callID); err != nil {
		return "", err
	}
	if err := validateVerb(verb); err != nil {
		return "", err
	}
	return Prefix + "." + prefix + "." + runID + "." + callID + "." + string(verb), nil
}

// RunSubject is toolwire.run.<run_id>.<verb> for the run verbs requested,
// started, suspended, resumed, completed and failed.
func RunSubject(runID string, verb Verb) (string, error) { return runSubject(runID, verb) }

// IterationSubject is toolwire.run.<run_id>.iteration.<n>.<verb> (requested,
// approved, denied).
func IterationSubject(runID string, n int, verb Verb) (string, error) {
	if n < 1 {
		return "", fmt.Errorf("iteration %d must be at least 1", n)
	}
	return runSubject(runID, verb, "iteration", strconv.Itoa(n))
}

// LLMSubject is toolwire.run.<run_id>.llm.<n>.completed.
func LLMSubject(runID string, n int) (string, error) {
	if n < 1 {
		return "", fmt.Errorf("iteration %d must be at least 1", n)
	}
	return runSubject(runID, VerbCompleted, "llm", strconv.Itoa(n))
}

// CallSubject is toolwire.call.<run_id>.<call_id>.<verb> (requested,
// approval_required, decided, approved, started, completed).
func CallSubject(runID, callID string, verb Verb) (string, error) {
	return callSubject("call", runID, callID, verb)
}

// SandboxSubject is toolwire.sandbox.<run_id>.<call_id>.<verb> (requested,
// completed).
func SandboxSubject(runID, callID string, verb Verb) (string, error) {
	return callSubject("sandbox", runID, callID, verb)
}

// RunEvents is the subject filter for every event of one run:
// toolwire.run.<run_id>.> (use CallEvents for its calls).
func RunEvents(runID string) (string, error) {
	if err := ValidateRunID(runID); err != nil {
		return "", err
	}
	return Prefix + ".run." + runID + ".>", nil
}

// CallEvents is the subject filter for every call event of one run.
func CallEvents(runID string) (string, error) {
	if err := ValidateRunID(runID); err != nil {
		return "", err
	}
	return Prefix + ".call." + runID + ".>", nil
}

// ParsedSubject is what a toolwire subject names.
type ParsedSubject struct {
	Kind      string // "run", "call" or "sandbox"
	RunID     string
	CallID    string // call and sandbox subjects
	Iteration int    // iteration and llm subjects
	Verb      Verb   // the last token
}

// ParseSubject splits a toolwire subject into its parts and checks its ids.
func ParseSubject(subject string) (ParsedSubject, error) {
	t := strings.Split(subject, ".")
	bad := func(why string) (ParsedSubject, error) {
		return ParsedSubject{}, fmt.Errorf("subject %q: %s", subject, why)
	}
	if len(t) < 4 || t[0] != Prefix {
		return bad("not a toolwire subject")
	}
	p := ParsedSubject{Kind: t[1], RunID: t[2], Verb: Verb(t[len(t)-1])}
	if err := ValidateRunID(p.RunID); err != nil {
		return ParsedSubject{}, err
	}
	switch p.Kind {
	case "run":
		switch len(t) {
		case 4:
		case 6:
			if t[3] != "iteration" && t[3] != "llm" {
				return bad("unknown run sub-subject " + t[3])
			}
			n, err := strconv.Atoi(t[4])
			if err != nil || n < 1 || strconv.Itoa(n) != t[4] {
				return bad("iteration must be a positive number")
			}
			p.Iteration = n
		default:
			return bad("wrong number of tokens")
		}
	case "call", "sandbox":
		if len(t) != 5 {
			return bad("wrong number of tokens")
		}
		p.CallID = t[3]
		if err := ValidateCallID(p.CallID); err != nil {
			return ParsedSubject{}, err
		}
	default:
		return bad("unknown kind " + p.Kind)
	}
	if err := validateVerb(p.Verb); err != nil {
		return bad(err.Error())
	}
	return p, nil
}
