// Package worker runs your own Go functions as toolwire tools, in a process of
// your own beside the pipeline (`toolwire dev`, or the service binaries).
//
// A tool is a Go function with a typed input and output: Func derives the
// tool's JSON Schemas from the two types and declares, in code, what the
// Policy Guard and the executor need to know about it (name, version,
// description, side effects, cost, timeout, cache policy, rate limit, the
// secrets it needs, the queue it is served on). A Worker serves tools:
//
//	type In struct {
//		Text string `json:"text" jsonschema:"the text to upper-case"`
//	}
//	type Out struct {
//		Text string `json:"text"`
//	}
//	upper := worker.Func(worker.Def{
//		Name: "upper", Version: "1.0.0", Description: "Upper-cases a text.",
//		SideEffects: worker.SideEffectsNone, Queue: "text",
//	}, func(ctx context.Context, in In) (Out, error) {
//		return Out{Text: strings.ToUpper(in.Text)}, nil
//	})
//	err := worker.New(worker.Config{}, upper).Run(ctx) // NATS_URL from the environment
//
// or, as a program's whole main function, worker.New(worker.Config{},
// upper).Main(), which runs until SIGINT or SIGTERM and exits 1 on an error.
//
// Run registers each definition in the tool registry, refusing a version
// already registered with another definition (as `toolwire tools register`
// does: a changed tool is a new version), and serves the calls the Policy
// Guard approves on the tools' queues through the executor's own call
// pipeline, the one the built-in tools run through: input and output
// validated against the schemas, rate limits, the cache, secrets, the
// timeout, oversized outputs stored as blobs, a writes tool run at most once
// per call, secret values scrubbed, spans and metrics.
//
// What a tool returns: an error made by Errorf (or any *ToolError, wrapped or
// not) reaches the model with its code and message; any other error reaches
// it as UNKNOWN ("internal error in tool ..."), and the error itself is only
// logged; a panic is an UNKNOWN too, logged with its stack, and the worker
// goes on serving.
//
// A tool's context ends at its timeout, and when its run is cancelled (the
// executor tells every replica of the queue, which stops the call it runs):
// a tool that waits or does I/O should pass its context on and return when
// it ends. The call is answered by the executor then; what the tool returns
// afterwards is not read.
//
// Start and Stop run a worker inside a process that already has a JetStream
// connection (tests: see package workertest).
package worker
