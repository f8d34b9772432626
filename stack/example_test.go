package stack_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	// Aliased: the package's tests have a helper named scripted.
	scriptedmodel "github.com/toolwire/toolwire/services/orchestrator/provider/scripted"
	"github.com/toolwire/toolwire/stack"
)

// Start runs the whole pipeline in the process: here one run of the scripted
// model, which calls the built-in echo once and then answers, submitted and
// awaited by the stack's client. The run's outputs hold every call's
// envelope under its call id, which is envelope.CallID of the call, and the
// agent's pinned handle selects echo's.
func ExampleStart() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "toolwire-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	st, err := stack.Start(ctx, stack.Options{
		DataDir: dir, // the embedded NATS server's JetStream store
		// An empty environment: no model keys or TOOLWIRE_* settings of
		// the shell change what the example prints.
		Getenv: func(string) string { return "" },
	})
	if err != nil {
		panic(err)
	}
	defer st.Stop(context.Background())

	input := json.RawMessage(`{"text":"hello"}`)
	script, _ := json.Marshal(scriptedmodel.Script{Turns: []scriptedmodel.Turn{
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "echo", Arguments: input}}},
		{Content: "echo said hello"},
	}})
	req := envelope.RunRequest{
		RunID:  "example-start",
		Tenant: envelope.Tenant{OrgID: "example-org", WorkspaceID: "example-ws", UserID: "example-user"},
		Agent: envelope.Agent{
			Name:         "example",
			Model:        envelope.Model{Provider: scriptedmodel.Name, Name: "script", Options: script},
			EnabledTools: []string{"echo@1.0.0"},
			PinnedHandles: []envelope.PinnedHandle{
				{Name: "echoed", Selector: envelope.PinSelector{Tool: "echo"}},
			},
		},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "Say hello through echo."}},
	}
	res, err := st.Client.Run(ctx, req, 0)
	if err != nil {
		panic(err)
	}
	fmt.Println("status:", res.Status)
	fmt.Println("response:", res.Outputs.Response)
	callID, _ := envelope.CallID("echo", "1.0.0", input, 1) // the run's first call
	env := res.Outputs.ToolsByID[callID]
	fmt.Printf("%s (call %s...): %s\n", env.ToolRef(), callID[:12], env.Output)
	fmt.Println("pinned echoed:", string(res.Pinned["echoed"].Output))
	// Output:
	// status: completed
	// response: echo said hello
	// echo@1.0.0 (call c826a309dc85...): {"text":"hello"}
	// pinned echoed: {"text":"hello"}
}

// A run submitted with the stack's client (a client.Client on the stack's
// JetStream) and followed event by event: Follow hands the callback the run's
// request, its turn, the turn's call (approved, completed), and the run's end
// last, then returns the end with the outputs.
//
// The example lives in package stack, not client, because following a run
// needs the pipeline that runs it; the client module's own tests run on a
// bare NATS server only.
func ExampleStack_submitAndFollow() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "toolwire-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	st, err := stack.Start(ctx, stack.Options{DataDir: dir, Getenv: func(string) string { return "" }})
	if err != nil {
		panic(err)
	}
	defer st.Stop(context.Background())

	script, _ := json.Marshal(scriptedmodel.Script{Turns: []scriptedmodel.Turn{
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "echo", Arguments: json.RawMessage(`{"text":"hi"}`)}}},
		{Content: "done"},
	}})
	req := envelope.RunRequest{
		RunID:  "example-follow",
		Tenant: envelope.Tenant{OrgID: "example-org", WorkspaceID: "example-ws", UserID: "example-user"},
		Agent: envelope.Agent{
			Name:         "example",
			Model:        envelope.Model{Provider: scriptedmodel.Name, Name: "script", Options: script},
			EnabledTools: []string{"echo@1.0.0"},
		},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "Say hi through echo."}},
	}
	if err := st.Client.Submit(ctx, req); err != nil {
		panic(err)
	}
	// Submitting the same request again (a retry whose answer was lost)
	// starts the run once.
	if err := st.Client.Submit(ctx, req); err != nil {
		panic(err)
	}

	end, err := st.Client.Follow(ctx, req.RunID, func(e client.Event) bool {
		typ := e.Event.Type()
		// A started event goes out only for a call, or a first model
		// call, that is slow: left out, so that the output is the same
		// on a busy machine.
		if typ == events.TypeRunStarted || typ == events.TypeCallStarted {
			return true
		}
		what := e.Subject.Kind
		switch {
		case e.Subject.Iteration > 0:
			what = fmt.Sprintf("run turn %d", e.Subject.Iteration)
		case e.Subject.CallID != "":
			what = "call " + e.Subject.CallID[:12] + "..."
		}
		fmt.Printf("%-20s %s\n", what, strings.TrimPrefix(typ, "dev.toolwire."))
		return true
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(end.Status, end.Outputs.Response, end.ToolCalls)
	// Output:
	// run                  run.requested.v1
	// run turn 1           run.turn.completed.v1
	// call 281a20245ff4... call.approved.v1
	// call 281a20245ff4... call.completed.v1
	// run                  run.completed.v1
	// completed done 1
}
