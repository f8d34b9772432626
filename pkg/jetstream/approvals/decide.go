package approvals

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
)

// Deciding an approval, as `toolwire approve|deny|revise` and the recorder's
// timeline page both do: read the call's approval record, check that it
// still waits, publish the decided event. The Policy Guard applies it.

// Errors of deciding.
var (
	// ErrNoApproval: no call of that id awaits (or awaited) approval.
	ErrNoApproval = errors.New("no such call awaits approval")
	// ErrAlreadyDecided: the call was decided, or its approval timed out.
	ErrAlreadyDecided = errors.New("the call was already decided")
	// ErrAmbiguousCall: a short call id matches several calls of the run.
	ErrAmbiguousCall = errors.New("the short call id matches several calls")
)

// ShortCallIDLen is how many leading hex digits of a call id the CLI and
// the timeline page show; MinShortCallIDLen is the fewest ResolveCallID
// accepts as a prefix.
const (
	ShortCallIDLen    = 12
	MinShortCallIDLen = 6
)

// ShortCallID returns the leading ShortCallIDLen digits of a call id.
func ShortCallID(callID string) string {
	if len(callID) <= ShortCallIDLen {
		return callID
	}
	return callID[:ShortCallIDLen]
}

// approvals opens the approvals bucket.
func approvals(ctx context.Context, js jetstream.JetStream) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, events.BucketApprovals)
	if err != nil {
		return nil, fmt.Errorf("open approvals: %w (is toolwire provisioned on this NATS?)", err)
	}
	return kv, nil
}

// ResolveCallID returns the full id of the call of runID that id names: the
// call itself when one awaited approval under that id, else the one call
// whose id starts with id (at least MinShortCallIDLen digits). ErrNoApproval
// when none does, ErrAmbiguousCall when several do.
func ResolveCallID(ctx context.Context, js jetstream.JetStream, runID, id string) (string, error) {
	id = strings.ToLower(strings.TrimSpace(id))
	key, err := events.ApprovalKey(runID, id)
	if err != nil {
		return "", err
	}
	kv, err := approvals(ctx, js)
	if err != nil {
		return "", err
	}
	if _, err := kv.Get(ctx, key); err == nil {
		return id, nil
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", fmt.Errorf("read approval: %w", err)
	}
	if len(id) < MinShortCallIDLen {
		return "", fmt.Errorf("%w: call %s of run %s is unknown, or needed no approval (a short call id has at least %d digits)",
			ErrNoApproval, id, runID, MinShortCallIDLen)
	}
	lister, err := kv.ListKeysFiltered(ctx, runID+".*")
	if err != nil {
		return "", fmt.Errorf("list approvals: %w", err)
	}
	var matches []string
	for k := range lister.Keys() {
		if call := strings.TrimPrefix(k, runID+"."); strings.HasPrefix(call, id) {
			matches = append(matches, call)
		}
	}
	sort.Strings(matches)
	switch len(matches) {
	case 0:
		return "", fmt.Errorf("%w: call %s of run %s is unknown, or needed no approval", ErrNoApproval, id, runID)
	case 1:
		return matches[0], nil
	}
	return "", fmt.Errorf("%w: %s matches %d calls of run %s (%s): give more digits", ErrAmbiguousCall, id, len(matches), runID,
		strings.Join(matches, ", "))
}

// PendingApproval reads the approval record of a call and checks that it
// still awaits a decision (ErrNoApproval, ErrAlreadyDecided otherwise).
func PendingApproval(ctx context.Context, js jetstream.JetStream, runID, callID string) (events.ApprovalRecord, error) {
	key, err := events.ApprovalKey(runID, callID)
	if err != nil {
		return events.ApprovalRecord{}, err
	}
	kv, err := approvals(ctx, js)
	if err != nil {
		return events.ApprovalRecord{}, err
	}
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return events.ApprovalRecord{}, fmt.Errorf("%w: call %s of run %s is unknown, or needed no approval", ErrNoApproval, callID, runID)
	}
	if err != nil {
		return events.ApprovalRecord{}, fmt.Errorf("read approval: %w", err)
	}
	rec, err := events.DecodeApprovalRecord(e.Value())
	if err != nil {
		return rec, err
	}
	if !rec.Pending() {
		return rec, fmt.Errorf("%w: call %s of run %s was %s", ErrAlreadyDecided, callID, runID, DecidedAs(&rec))
	}
	if !time.Now().Before(rec.Deadline) {
		return rec, fmt.Errorf("%w: the approval of call %s of run %s timed out at %s (a denial)", ErrAlreadyDecided,
			callID, runID, rec.Deadline.Format(time.RFC3339))
	}
	return rec, nil
}

// DecidedAs says how a settled approval was settled, by whom and when.
func DecidedAs(rec *events.ApprovalRecord) string {
	if rec.State == events.ApprovalExpired {
		return "denied: its approval timed out"
	}
	if rec.State == events.ApprovalWithdrawn {
		if rec.Withdrawn == "" {
			return "withdrawn: its run was cancelled"
		}
		return "withdrawn: the run was " + rec.Withdrawn
	}
	s := string(rec.State)
	if rec.Decision != nil && rec.Decision.By != "" {
		s += " by " + rec.Decision.By
	}
	if rec.DecidedAt != nil {
		s += " at " + rec.DecidedAt.Format(time.RFC3339)
	}
	return s
}

// PublishDecision publishes the decided event of d (source names the
// publisher: the CLI, the recorder's page) for the call of rec, on the
// condition that the call's decided subject holds none: a decision already
// published for the call (by anyone, however long ago) is reported
// (ErrAlreadyDecided), not published beside it, as is the same decision
// published again within the stream's duplicate window (its id is one per
// call and decision: events.NewDecided).
func PublishDecision(ctx context.Context, js jetstream.JetStream, source string, d events.Decision, rec events.ApprovalRecord) error {
	out, err := events.NewDecided(source, d, rec.Call.Tenant, rec.Trace)
	if err != nil {
		return err
	}
	m, err := events.Encode(out.Subject, &out.Event)
	if err != nil {
		return err
	}
	ack, err := js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(0))
	if publish.WrongLastSequence(err) {
		return fmt.Errorf("%w: a decision for call %s of run %s was already published", ErrAlreadyDecided, d.CallID, d.RunID)
	}
	if err != nil {
		return fmt.Errorf("publish the decision: %w", err)
	}
	if ack.Duplicate {
		return fmt.Errorf("%w: a decision for call %s of run %s was already published", ErrAlreadyDecided, d.CallID, d.RunID)
	}
	return nil
}
