package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

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
			reg, err := registry.Open(ctx, js)
			if err != nil {
				return err
			}
			entries, err := reg.List(ctx)
			if err != nil {
				return err
			}
			ws, werr := registry.ListWorkers(ctx, js, time.Now())
			served := registry.ByQueue(ws)
			f := checkAgent(agent, registry.LookupIn(entries), func(q string) bool { return werr != nil || len(served[q]) > 0 })
			if werr != nil {
				f.Warnings = append(f.Warnings, fmt.Sprintf("the queues' workers are unknown (no heartbeats: %v)", werr))
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

// checkAgent checks an agent's enabled tools against the registry: their
// lifecycle (registry.CheckTools), what the guard will say of their calls,
// and whether a live worker serves their queue (served).
func checkAgent(a envelope.Agent, lookup func(envelope.ToolRef) (registry.Entry, bool), served func(queue string) bool) registry.Findings {
	f := registry.CheckTools(lookup, a.EnabledTools)
	ceiling := a.Policy.SideEffectCeiling()
	for _, s := range a.EnabledTools {
		ref, err := envelope.ParseToolRef(s)
		if err != nil {
			continue
		}
		e, ok := lookup(ref)
		if !ok || e.State == registry.StateBlocked {
			continue
		}
		d := e.Definition
		if q := cmp.Or(d.Queue, envelope.DefaultQueue); !served(q) {
			f.Warnings = append(f.Warnings, fmt.Sprintf("tool %s runs on queue %q, which no live worker serves: its calls will fail with PROVIDER_ERROR until one starts",
				ref, q))
		}
		if d.Metadata.SideEffects.Rank() > ceiling.Rank() {
			f.Warnings = append(f.Warnings, fmt.Sprintf("tool %s has side effects %q, above the agent's ceiling %q: its calls will be denied",
				ref, d.Metadata.SideEffects, ceiling))
		}
		var missing []string
		for _, sc := range d.RequiredScopes {
			if !slices.Contains(a.Policy.Scopes, sc) {
				missing = append(missing, sc)
			}
		}
		if len(missing) > 0 {
			f.Warnings = append(f.Warnings, fmt.Sprintf("tool %s needs scopes the policy does not grant (%s): its calls will be denied",
				ref, strings.Join(missing, ", ")))
		}
		if unbound := unboundWebSecrets(&d); len(unbound) > 0 {
			f.Warnings = append(f.Warnings, fmt.Sprintf("tool %s is a web tool that declares %s with no secret_destinations: "+
				"a call that sends them will be denied (docs/tools.md, Secrets by name)", ref, strings.Join(unbound, ", ")))
		}
	}
	return f
}

// webToolBuiltins are the builtins that send secrets by name in a call's
// secret_headers, only where the definition binds them
// (services/executor/tools/web/http_request.go).
var webToolBuiltins = []string{"http_get", "http_request"}

// unboundWebSecrets lists the secrets a version of a web tool declares
// without binding them to destinations: stored before bindings existed,
// they are sent nowhere.
func unboundWebSecrets(d *envelope.ToolDefinition) []string {
	if d.Implementation.Kind != envelope.ImplBuiltin || len(d.RequiredSecrets) == 0 {
		return nil
	}
	key := d.Name
	var c struct {
		Builtin string `json:"builtin"`
	}
	if len(d.Implementation.Config) > 0 && json.Unmarshal(d.Implementation.Config, &c) == nil && c.Builtin != "" {
		key = c.Builtin
	}
	if !slices.Contains(webToolBuiltins, key) {
		return nil
	}
	var out []string
	for _, name := range d.RequiredSecrets {
		if _, ok := d.SecretDestinations[name]; !ok {
			out = append(out, name)
		}
	}
	return out
}
