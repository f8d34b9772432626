package events

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Subject prefixes and stream names (docs/architecture.md, Events: Subjects,
// Streams).
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

	// ImportedJSAPI is the JetStream API prefix of a client in an account
	// that imports its reads from toolwire's system account (a producer's:
	// docs/operations.md, Accounts), for jetstream.NewWithAPIPrefix. Its
	// requests cross into the system account as $JS.API requests.
	ImportedJSAPI = "$JS.toolwire.API"
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

// TurnSubject is toolwire.run.<run_id>.turn.<n>.completed.
func TurnSubject(runID string, n int) (string, error) {
	if n < 1 {
		return "", fmt.Errorf("turn %d must be at least 1", n)
	}
	return runSubject(runID, VerbCompleted, "turn", strconv.Itoa(n))
}

// CallSubject is toolwire.call.<run_id>.<call_id>.<verb> (approval_required,
// decided, started, completed); approved calls are on ApprovedSubject.
func CallSubject(runID, callID string, verb Verb) (string, error) {
	if verb == VerbApproved {
		return "", fmt.Errorf("an approved call's subject names its queue: use ApprovedSubject")
	}
	return callSubject("call", runID, callID, verb)
}

// ApprovedSubject is toolwire.call.<run_id>.<call_id>.approved.<queue>: an
// approved call, routed to the workers of queue.
func ApprovedSubject(runID, callID, queue string) (string, error) {
	if err := envelope.ValidateQueue(queue); err != nil {
		return "", err
	}
	s, err := callSubject("call", runID, callID, VerbApproved)
	if err != nil {
		return "", err
	}
	return s + "." + queue, nil
}

// ApprovedFilter is the subject filter of the approved calls of one queue,
// every run: what a worker of the queue consumes.
func ApprovedFilter(queue string) (string, error) {
	if err := envelope.ValidateQueue(queue); err != nil {
		return "", err
	}
	return string(FilterCallApproved)[:len(FilterCallApproved)-1] + queue, nil
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

// SandboxEvents is the subject filter for every sandbox job event of one run.
func SandboxEvents(runID string) (string, error) {
	if err := ValidateRunID(runID); err != nil {
		return "", err
	}
	return Prefix + ".sandbox." + runID + ".>", nil
}

// ParsedSubject is what a toolwire subject names.
type ParsedSubject struct {
	Kind      string // "run", "call" or "sandbox"
	RunID     string
	CallID    string // call and sandbox subjects
	Iteration int    // turn subjects: n
	Verb      Verb   // what happened
	Queue     string // approved call subjects: the queue
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
			if t[3] != "turn" {
				return bad("unknown run sub-subject " + t[3])
			}
			n, err := strconv.Atoi(t[4])
			if err != nil || n < 1 || strconv.Itoa(n) != t[4] {
				return bad("turn must be a positive number")
			}
			p.Iteration = n
		default:
			return bad("wrong number of tokens")
		}
	case "call", "sandbox":
		switch {
		case len(t) == 5:
		case len(t) == 6 && p.Kind == "call" && t[4] == string(VerbApproved):
			// toolwire.call.<run>.<call>.approved.<queue>
			p.Verb, p.Queue = VerbApproved, t[5]
			if err := envelope.ValidateQueue(p.Queue); err != nil {
				return bad(err.Error())
			}
		default:
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
