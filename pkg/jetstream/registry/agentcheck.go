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
