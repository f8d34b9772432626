package policy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// SideEffects applies the agent's side-effect ceiling (spec 5.1,
// side_effects): a tool whose declared side effects rank above the ceiling is
// refused, so a read-only node (ceiling reads) never runs a tool that writes.
// No ceiling means writes: everything is allowed. A tool whose side effects
// the guard does not know is refused: it fails closed.
func SideEffects(c *CallCheck) Decision {
	ceiling := c.Request.Policy.SideEffectCeiling()
	got := effectiveSideEffects(&c.Entry.Definition)
	if got.Rank() < 0 {
		return Deny("tool %s declares unknown side effects %q", c.Request.Ref(), got)
	}
	if ceiling.Rank() < 0 {
		return Deny("the agent's side_effects ceiling %q is not one of none, reads, writes", ceiling)
	}
	if got.Rank() > ceiling.Rank() {
		return Deny("tool %s has side effects %q, above this agent's ceiling %q", c.Request.Ref(), got, ceiling)
	}
	return Allow()
}

// Scopes requires every scope the tool's definition names (required_scopes)
// to be granted to the run (policy.scopes).
func Scopes(c *CallCheck) Decision {
	var missing []string
	for _, s := range c.Entry.Definition.RequiredScopes {
		if !slices.Contains(c.Request.Policy.Scopes, s) {
			missing = append(missing, s)
		}
	}
	if len(missing) == 0 {
		return Allow()
	}
	granted := "none"
	if len(c.Request.Policy.Scopes) > 0 {
		granted = strings.Join(c.Request.Policy.Scopes, ", ")
	}
	noun := "scope"
	if len(missing) > 1 {
		noun = "scopes"
	}
	return Deny("tool %s needs %s %s, not granted to this run (granted: %s)",
		c.Request.Ref(), noun, strings.Join(missing, ", "), granted)
}

// effectiveSideEffects is what the guard assumes a tool does: its declared
// side effects, or writes (the worst) when it declares none. The registry
// never stores a definition without them; a hand-made lookup might.
func effectiveSideEffects(def *envelope.ToolDefinition) envelope.SideEffects {
	if def.Metadata.SideEffects == "" {
		return envelope.SideEffectsWrites
	}
	return def.Metadata.SideEffects
}

// describeEffect is what an approval request says the call will change.
func describeEffect(def *envelope.ToolDefinition) string {
	what := strings.TrimSpace(def.Description)
	if what != "" && !strings.HasSuffix(what, ".") {
		what += "."
	}
	var effect string
	switch def.Metadata.SideEffects {
	case envelope.SideEffectsWrites:
		effect = "It writes: it changes external state, and runs at most once for this call."
	case envelope.SideEffectsReads:
		effect = "It reads external data and changes nothing."
	case envelope.SideEffectsNone:
		effect = "It has no side effects."
	default:
		effect = fmt.Sprintf("Its side effects (%q) are unknown.", def.Metadata.SideEffects)
	}
	return strings.TrimSpace(fmt.Sprintf("Calls %s. %s %s", def.Ref(), what, effect))
}
