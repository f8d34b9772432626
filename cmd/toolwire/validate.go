package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
)

// newValidateCmd is `toolwire validate FILE`.
func newValidateCmd() *cobra.Command {
	var (
		n      cliNATS
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "validate FILE",
		Short: "Check an agent configuration against the tool registry",
		Long: `validate checks an agent configuration (an agent object, or a whole run request)
in JSON or YAML ("-": standard input) against its contract and the tool registry, as
a compile-time check of a workflow:

  errors (exit 1):   a malformed configuration; an enabled tool that is unknown or
                     blocked (the run would be refused).
  warnings (exit 0): an enabled tool that is deprecated (still callable); a tool
                     whose side effects are above the agent's ceiling, or that needs
                     scopes the policy does not grant (its calls would be denied); a
                     tool whose queue no live worker serves (its calls would fail
                     with PROVIDER_ERROR after the guard's queue wait); a version
                     of a web tool (http_get, http_request) that declares secrets
                     without secret_destinations (its calls that send them would
                     be denied).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := readJSONOrYAML(args[0], cmd.InOrStdin())
			if err != nil {
				return err
			}
			agent, err := decodeAgentConfig(b)
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			ctx, _, js, done, err := n.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			f, err := registry.CheckAgentNow(ctx, js, agent)
			if err != nil {
				return err
			}
			if asJSON {
				if err := printJSON(cmd.OutOrStdout(), f); err != nil {
					return err
				}
			} else {
				for _, w := range f.Warnings {
					fmt.Fprintln(cmd.OutOrStdout(), "warning:", w)
				}
				for _, p := range f.Problems {
					fmt.Fprintln(cmd.OutOrStdout(), "error:", p)
				}
				if len(f.Warnings)+len(f.Problems) == 0 {
					fmt.Fprintf(cmd.OutOrStdout(), "ok: agent %s, %d enabled tools\n", agent.Name, len(agent.EnabledTools))
				}
			}
			if len(f.Problems) > 0 {
				return fmt.Errorf("%s: %w: %d errors, %d warnings", args[0], errFindings, len(f.Problems), len(f.Warnings))
			}
			return nil
		},
	}
	n.flags(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, `print {"warnings": [...], "problems": [...]} as JSON`)
	return cmd
}

// decodeAgentConfig decodes a run request or an agent object, strictly, and
// checks it as a run request would be checked.
func decodeAgentConfig(b []byte) (envelope.Agent, error) {
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(b, &probe); err != nil {
		return envelope.Agent{}, fmt.Errorf("not a JSON object: %w", err)
	}
	var req envelope.RunRequest
	if _, isRequest := probe["agent"]; isRequest {
		if err := decodeStrict(b, &req); err != nil {
			return envelope.Agent{}, fmt.Errorf("run request: %w", err)
		}
		if err := req.Validate(); err != nil {
			return req.Agent, err
		}
		return req.Agent, nil
	}
	if err := decodeStrict(b, &req.Agent); err != nil {
		return envelope.Agent{}, fmt.Errorf("agent: %w", err)
	}
	// Checked as the agent of a minimal run request; only the agent's
	// problems can show.
	req.RunID, req.Tenant.OrgID = "validate", "validate"
	req.Messages = []envelope.Message{{Role: envelope.RoleUser, Content: "validate"}}
	if err := req.Validate(); err != nil {
		return req.Agent, err
	}
	return req.Agent, nil
}
