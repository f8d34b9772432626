package rules_test

import (
	"fmt"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/rules"
)

// The Policy Guard judges each call of a model turn with what the run request
// says (the agent's enabled tools and policy) and what the registry says of
// the tool: the first rule that denies decides, and its decision names the
// rule and says why; an allowed call may still have to wait for an operator.
func ExampleGuard_CheckCall() {
	g := rules.NewGuard()
	echo := &envelope.ToolDefinition{Name: "echo", Version: "1.0.0",
		Metadata: envelope.ToolMetadata{SideEffects: envelope.SideEffectsNone}}
	deploy := &envelope.ToolDefinition{Name: "deploy", Version: "2.0.0",
		Metadata: envelope.ToolMetadata{SideEffects: envelope.SideEffectsWrites}}
	enabled := []string{"echo@1.0.0", "deploy@2.0.0"}
	show := func(what string, d rules.Decision) {
		switch {
		case !d.Allowed:
			fmt.Printf("%s: %s by %s: %s\n", what, d.Code, d.Rule, d.Reason)
		case d.ApprovalRequired != "":
			fmt.Printf("%s: allowed, after approval: %s\n", what, d.ApprovalRequired)
		default:
			fmt.Printf("%s: allowed\n", what)
		}
	}

	show("echo", g.CheckCall(rules.Call{Seq: 1, Name: "echo", Version: "1.0.0",
		EnabledTools: enabled, Tool: echo, State: envelope.ToolActive}))
	// The model named a tool the agent has not enabled: the orchestrator
	// found no version for it.
	show("rm", g.CheckCall(rules.Call{Seq: 2, Name: "rm", EnabledTools: enabled}))
	// A read-only agent never runs a tool that writes.
	show("deploy, read-only agent", g.CheckCall(rules.Call{Seq: 3, Name: "deploy", Version: "2.0.0",
		EnabledTools: enabled, Tool: deploy, State: envelope.ToolActive,
		Policy: envelope.Policy{SideEffects: envelope.SideEffectsReads}}))
	// One that may write, under a policy that wants writes approved.
	show("deploy, writes approved", g.CheckCall(rules.Call{Seq: 4, Name: "deploy", Version: "2.0.0",
		EnabledTools: enabled, Tool: deploy, State: envelope.ToolActive,
		Policy: envelope.Policy{RequireApproval: &envelope.ApprovalPolicy{Writes: true}}}))
	// The run's tool-call cap.
	show("echo #4", g.CheckCall(rules.Call{Seq: 4, Name: "echo", Version: "1.0.0",
		EnabledTools: enabled, Tool: echo, State: envelope.ToolActive,
		Policy: envelope.Policy{MaxToolCalls: 3}}))
	// Output:
	// echo: allowed
	// rm: POLICY_DENIED by enabled_tools: tool rm is not enabled for this agent (enabled: echo@1.0.0, deploy@2.0.0)
	// deploy, read-only agent: POLICY_DENIED by side_effects: tool deploy@2.0.0 has side effects "writes", above this agent's ceiling "reads"
	// deploy, writes approved: allowed, after approval: the policy requires approval for tools that write, and deploy@2.0.0 writes
	// echo #4: POLICY_DENIED by max_tool_calls: max_tool_calls (3) reached: call #4 not allowed
}

// Before each model call the loop rules judge the run so far: the iteration
// cap, then the budget, which counts the least the next call will cost.
func ExampleGuard_CheckLoop() {
	g := rules.NewGuard()
	policy := envelope.Policy{MaxIterations: 3, MaxBudget: 0.05}
	for _, l := range []rules.Loop{
		{Iteration: 2, Policy: policy, Spend: 0.01, MinCost: 0.01},
		{Iteration: 3, Policy: policy, Spend: 0.04, MinCost: 0.02},
		{Iteration: 4, Policy: policy, Spend: 0.01},
	} {
		d := g.CheckLoop(l)
		if d.Allowed {
			fmt.Printf("call %d: allowed\n", l.Iteration)
			continue
		}
		fmt.Printf("call %d: denied by %s: %s\n", l.Iteration, d.Rule, d.Reason)
	}
	// Output:
	// call 2: allowed
	// call 3: denied by max_budget: max_budget (0.05) would be exceeded by model call 3: the run has spent 0.04 and the call costs at least 0.02
	// call 4: denied by max_iterations: max_iterations (3) reached: iteration 4 not allowed
}

// Gates.For is the gate matrix's verdict on a call: the autonomy of the
// agent node, the risk of the call (ToolDefinition.RiskOf), and an org's
// overrides.
func ExampleGates_For() {
	var gates rules.Gates // the default matrix, no overrides
	fmt.Println(gates.For("acme", envelope.AutonomySupervised, envelope.RiskMedium, "").Cell())
	overrides, err := rules.ParseGateOverrides("acme:*/medium=confirm")
	if err != nil {
		panic(err)
	}
	gates.Overrides = overrides
	fmt.Println(gates.For("acme", envelope.AutonomySupervised, envelope.RiskMedium, "POST").Cell())
	// Output:
	// supervised × medium → preview (default)
	// supervised × medium (POST) → confirm (org acme)
}
