package events

import (
	"errors"
	"fmt"
	"strings"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// The intake: where an upstream producer limited to one tenant hands in its
// run requests. A run request's subject (toolwire.run.<run_id>.requested)
// names no tenant, so NATS permissions cannot limit a producer to one
// tenant's runs there; an intake subject names the tenant, and a producer's
// permission to publish under toolwire.intake.<org>.> is what limits it.
// The orchestrator takes each intake, checks that the request's tenant is
// the subject's (a producer of one tenant cannot send another's request in
// its subject) and that no other tenant's run holds the run id, and
// publishes it as the run's request. The stream is a work queue: an intake
// is gone once handed over.
const (
	StreamIntake   = "TOOLWIRE_INTAKE"
	SubjectsIntake = Prefix + ".intake.>"

	// NoWorkspace is the workspace token of an intake subject whose tenant
	// names no workspace.
	NoWorkspace = "_"
)

// ErrIntakeTenant is wrapped when a tenant cannot be named in an intake
// subject, or a request's tenant is not its intake subject's.
var ErrIntakeTenant = errors.New("intake tenant")

// validateTenantToken checks that s is one plain subject token: 1-64
// letters, digits, '-' or '_'.
func validateTenantToken(what, s string) error {
	if !envelope.IsToken(s, 64, func(c byte) bool {
		return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
	}) {
		return fmt.Errorf("%w: %s %q: an intake subject names it, so it must be 1-64 letters, digits, '-' or '_'", ErrIntakeTenant, what, s)
	}
	return nil
}

// IntakeTokens are the org and workspace tokens of tenant's intake
// subjects; a tenant without a workspace has NoWorkspace.
func IntakeTokens(org, workspace string) (string, string, error) {
	if err := validateTenantToken("org_id", org); err != nil {
		return "", "", err
	}
	if workspace == "" {
		return org, NoWorkspace, nil
	}
	if workspace == NoWorkspace {
		return "", "", fmt.Errorf("%w: workspace_id %q stands for no workspace in an intake subject", ErrIntakeTenant, workspace)
	}
	if err := validateTenantToken("workspace_id", workspace); err != nil {
		return "", "", err
	}
	return org, workspace, nil
}

// IntakeSubject is toolwire.intake.<org>.<workspace>.<run_id>, the subject
// a producer limited to tenant hands its run requests in on.
func IntakeSubject(tenant envelope.Tenant, runID string) (string, error) {
	org, ws, err := IntakeTokens(tenant.OrgID, tenant.WorkspaceID)
	if err != nil {
		return "", err
	}
	if err := ValidateRunID(runID); err != nil {
		return "", err
	}
	return Prefix + ".intake." + org + "." + ws + "." + runID, nil
}

// IntakeFilter is what a producer limited to a tenant may publish to: every
// intake subject of the org when workspace is "", else those of the
// workspace.
func IntakeFilter(org, workspace string) (string, error) {
	o, ws, err := IntakeTokens(org, workspace)
	if err != nil {
		return "", err
	}
	if workspace == "" {
		return Prefix + ".intake." + o + ".>", nil
	}
	return Prefix + ".intake." + o + "." + ws + ".*", nil
}

// IntakeOf is what an intake subject names.
type IntakeOf struct {
	Org       string
	Workspace string // "" for NoWorkspace
	RunID     string
}

// ParseIntakeSubject splits an intake subject and checks its tokens.
func ParseIntakeSubject(subject string) (IntakeOf, error) {
	t := strings.Split(subject, ".")
	if len(t) != 5 || t[0] != Prefix || t[1] != "intake" {
		return IntakeOf{}, fmt.Errorf("subject %q: not an intake subject (toolwire.intake.<org>.<workspace>.<run_id>)", subject)
	}
	ws := t[3]
	switch ws {
	case "":
		return IntakeOf{}, fmt.Errorf("subject %q: %w: an empty workspace token (%q stands for none)", subject, ErrIntakeTenant, NoWorkspace)
	case NoWorkspace:
		ws = ""
	}
	if _, _, err := IntakeTokens(t[2], ws); err != nil {
		return IntakeOf{}, fmt.Errorf("subject %q: %w", subject, err)
	}
	if err := ValidateRunID(t[4]); err != nil {
		return IntakeOf{}, fmt.Errorf("subject %q: %w", subject, err)
	}
	return IntakeOf{Org: t[2], Workspace: ws, RunID: t[4]}, nil
}

// Check reports whether req may come in on this intake subject: its run id
// and its tenant's org and workspace are the subject's.
func (in IntakeOf) Check(req envelope.RunRequest) error {
	switch {
	case req.RunID != in.RunID:
		return fmt.Errorf("%w: run_id %q is not the intake subject's %q", ErrIntakeTenant, req.RunID, in.RunID)
	case req.Tenant.OrgID != in.Org:
		return fmt.Errorf("%w: tenant.org_id %q is not the intake subject's %q", ErrIntakeTenant, req.Tenant.OrgID, in.Org)
	case req.Tenant.WorkspaceID != in.Workspace:
		return fmt.Errorf("%w: tenant.workspace_id %q is not the intake subject's %q", ErrIntakeTenant, req.Tenant.WorkspaceID, in.Workspace)
	}
	return nil
}

// NewRunIntake builds a run request on its tenant's intake subject: the
// event NewRunRequested builds, with the same id, and the subject as its
// Nats-Msg-Id. Any producer may choose any Nats-Msg-Id on its own intake
// subjects, one that names another tenant's subject too: a publisher that
// must not be dropped as the duplicate of such a message adds a nonce of
// its own (client.SubmitToIntake does). The id is no producer's to choose:
// the orchestrator hands every request over with RunRequestedID.
func NewRunIntake(source string, req envelope.RunRequest, trace RunTrace) (Outgoing, error) {
	out, err := NewRunRequested(source, req, trace)
	if err != nil {
		return Outgoing{}, err
	}
	if out.Subject, err = IntakeSubject(req.Tenant, req.RunID); err != nil {
		return Outgoing{}, err
	}
	// Deduped per tenant: another tenant's request for the same run id is
	// not this one's duplicate (it is refused when handed over).
	out.MsgID = out.Subject
	return out, nil
}
