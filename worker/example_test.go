package worker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/orchestrator/provider/scripted"
	"github.com/toolwire/toolwire/stack"
	"github.com/toolwire/toolwire/worker"
)

// Func declares a Go function as a tool: its schemas come from the types, the
// rest from the Def, and a declaration that breaks the rules carries its
// error, which the worker reports before it serves anything.
func ExampleFunc() {
	type In struct {
		City string `json:"city" jsonschema:"the city to look up"`
		Days int    `json:"days,omitempty" jsonschema:"how many days ahead; default 1"`
	}
	type Out struct {
		Forecast []string `json:"forecast"`
	}
	forecast := worker.Func(worker.Def{
		Name: "forecast", Version: "1.2.0", Description: "Forecasts the weather of a city.",
		SideEffects: worker.SideEffectsReads, Cost: 0.001, Timeout: 5 * time.Second, Queue: "weather",
	}, func(_ context.Context, in In) (Out, error) {
		return Out{Forecast: []string{"sunny in " + in.City}}, nil
	})
	def, err := forecast.Definition()
	if err != nil {
		panic(err)
	}
	fmt.Println(def.Ref(), "on queue", def.Queue, "|", def.Metadata.SideEffects, "| timeout", def.TimeoutMS, "ms")
	var schema bytes.Buffer
	_ = json.Indent(&schema, def.InputSchema, "", "  ")
	fmt.Println(schema.String())

	// Side effects have no default: a forgotten declaration is an error.
	bad := worker.Func(worker.Def{Name: "forecast", Version: "1.3.0", Description: "Forecasts."},
		func(context.Context, In) (Out, error) { return Out{}, nil })
	fmt.Println(bad.Err())
	// Output:
	// forecast@1.2.0 on queue weather | reads | timeout 5000 ms
	// {
	//   "type": "object",
	//   "properties": {
	//     "city": {
	//       "type": "string",
	//       "description": "the city to look up"
	//     },
	//     "days": {
	//       "type": "integer",
	//       "description": "how many days ahead; default 1"
	//     }
	//   },
	//   "$schema": "https://json-schema.org/draft/2020-12/schema",
	//   "required": [
	//     "city"
	//   ],
	//   "additionalProperties": false
	// }
	// invalid tool definition forecast@1.3.0: side effects must be declared: SideEffectsNone, SideEffectsReads or SideEffectsWrites
}

// WithPreview gives a tool a dry run: under a preview gate an operator
// sees what it returns before approving the call.
func ExampleWithPreview() {
	type In struct {
		To string `json:"to"`
	}
	send := worker.Func(worker.Def{Name: "send_note", Version: "1.0.0", Description: "Sends a note.", SideEffects: worker.SideEffectsWrites},
		func(context.Context, In) (struct{}, error) { return struct{}{}, nil })
	send = worker.WithPreview(send, func(_ context.Context, in In) (any, error) {
		return map[string]string{"would_send_to": in.To}, nil
	})
	def, err := send.Definition()
	if err != nil {
		panic(err)
	}
	fmt.Println(def.Ref(), "supports_preview:", def.SupportsPreview)
	// Output:
	// send_note@1.0.0 supports_preview: true
}

// Start serves a worker's tools inside a process that has a JetStream
// connection: here a stack's, whose scripted model calls the tool. A
// program of its own runs the worker with Run instead (NATS_URL from the
// environment).
func ExampleWorker_Start() {
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

	type In struct {
		Text string `json:"text" jsonschema:"the text to upper-case"`
	}
	type Out struct {
		Text string `json:"text"`
	}
	upper := worker.Func(worker.Def{
		Name: "upper", Version: "1.0.0", Description: "Upper-cases a text.",
		SideEffects: worker.SideEffectsNone, Queue: "text",
	}, func(ctx context.Context, in In) (Out, error) {
		return Out{Text: strings.ToUpper(in.Text)}, nil
	})
	w := worker.New(worker.Config{Getenv: func(string) string { return "" }}, upper)
	if err := w.Start(ctx, st.JS); err != nil {
		panic(err)
	}
	defer w.Stop(context.Background())

	script, _ := json.Marshal(scripted.Script{Turns: []scripted.Turn{
		{ToolCalls: []scripted.ToolCall{{Name: "upper", Arguments: json.RawMessage(`{"text":"hello"}`)}}},
		{Content: "done"},
	}})
	res, err := st.Client.Run(ctx, envelope.RunRequest{
		RunID:  "example-worker",
		Tenant: envelope.Tenant{OrgID: "example-org", WorkspaceID: "example-ws", UserID: "example-user"},
		Agent: envelope.Agent{
			Name:         "example",
			Model:        envelope.Model{Provider: scripted.Name, Name: "script", Options: script},
			EnabledTools: []string{"upper@1.0.0"},
		},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "Upper-case hello."}},
	}, 0)
	if err != nil {
		panic(err)
	}
	if res.Outputs == nil || res.Outputs.LastTool == nil {
		panic(fmt.Sprintf("run %s: %s", res.Status, res.Reason)) // a failed run says why
	}
	fmt.Println(res.Status, string(res.Outputs.LastTool.Output))
	// Output:
	// completed {"text":"HELLO"}
}
