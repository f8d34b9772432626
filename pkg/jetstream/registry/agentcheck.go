package registry

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/rules"
)

// CheckAgent checks an agent's enabled tools against the registry: their
// lifecycle (CheckTools), what the guard will say of their calls, and
// whether a live worker serves their queue (served). It is what
// `toolwire validate` and the recorder's agent builder report.
func CheckAgent(a envelope.Agent, lookup func(envelope.ToolRef) (Entry, bool), served func(queue string) bool) Findings {
	f := CheckTools(lookup, a.EnabledTools)
	ceiling := a.Policy.SideEffectCeiling()
	for _, s := range a.EnabledTools {
		ref, err := envelope.ParseToolRef(s)
		if err != nil {
			continue
		}
		e, ok := lookup(ref)
		if !ok || !e.State.Executable() {
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
		f.Warnings = append(f.Warnings, gateFindings(a, &d)...)
		if unbound := unboundWebSecrets(&d); len(unbound) > 0 {
			f.Warnings = append(f.Warnings, fmt.Sprintf("tool %s is a web tool that declares %s with no secret_destinations: "+
				"a call that sends them will be denied (docs/tools.md, Secrets by name)", ref, strings.Join(unbound, ", ")))
		}
	}
	return f
}

// CheckAgentNow is CheckAgent against js's registry and the workers whose
// heartbeats are live now. Heartbeats that cannot be read are a warning
// (every queue counts as served); a registry that cannot be read is an
// error.
func CheckAgentNow(ctx context.Context, js jetstream.JetStream, a envelope.Agent) (Findings, error) {
	reg, err := Open(ctx, js)
	if err != nil {
		return Findings{}, err
	}
	entries, err := reg.List(ctx)
	if err != nil {
		return Findings{}, err
	}
	ws, werr := ListWorkers(ctx, js, time.Now())
	served := ByQueue(ws)
	f := CheckAgent(a, LookupIn(entries), func(q string) bool { return werr != nil || len(served[q]) > 0 })
	if werr != nil {
		f.Warnings = append(f.Warnings, fmt.Sprintf("the queues' workers are unknown (no heartbeats: %v)", werr))
	}
	return f, nil
}

// gateFindings say what the default gate matrix (rules.DefaultGates; an
// org's overrides, which the policy service holds, may change it) does with
// the tool's calls under the agent's autonomy, when it does more than run
// them: for its default risk and for each action of its risk map.
func gateFindings(a envelope.Agent, d *envelope.ToolDefinition) []string {
	var g rules.Gates
	say := func(v envelope.GateVerdict) string {
		ref := d.Ref().String()
		if v.Action != "" {
			ref += " (action " + v.Action + ")"
		}
		switch v.Gate {
		case envelope.GateDeny:
			return fmt.Sprintf("tool %s: its calls will be denied by the gate matrix: %s", ref, v.Cell())
		case envelope.GatePreview:
			if !d.SupportsPreview {
				return fmt.Sprintf("tool %s: its calls will wait for an operator: %s, which falls back to confirm: the tool has no dry run", ref, v.Cell())
			}
			return fmt.Sprintf("tool %s: its calls will wait for an operator, with their dry run: %s", ref, v.Cell())
		default:
			return fmt.Sprintf("tool %s: its calls will wait for an operator: %s", ref, v.Cell())
		}
	}
	var out []string
	risk, _ := d.RiskOf(nil)
	if v := g.For("", a.Policy.Autonomy, risk, ""); v.Gate != envelope.GateAuto {
		out = append(out, say(v))
	}
	if d.Risk != nil {
		actions := make([]string, 0, len(d.Risk.Actions))
		for k := range d.Risk.Actions {
			actions = append(actions, k)
		}
		slices.Sort(actions)
		for _, act := range actions {
			if v := g.For("", a.Policy.Autonomy, d.Risk.Actions[act], act); v.Gate != envelope.GateAuto {
				out = append(out, say(v))
			}
		}
	}
	return out
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
