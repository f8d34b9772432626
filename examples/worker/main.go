// Command worker serves one tool of your own, upper@1.0.0 on the queue
// "text", beside a running toolwire (`toolwire dev`, or the service
// binaries). It needs only NATS_URL:
//
//	go run ./cmd/toolwire dev                                   # one shell
//	NATS_URL=nats://127.0.0.1:4223 go run ./examples/worker     # another
//	go run ./cmd/toolwire call upper@1.0.0 --input '{"text":"hello"}'
//
// Every call of upper@1.0.0, from a run or from `toolwire call`, is routed to
// the queue "text" and runs here, through the same pipeline as the built-in
// tools (validation, cache, timeouts, truncation, spans, metrics). Start it
// twice and the two share the calls. Stop it with Ctrl-C: it finishes the
// calls in flight first.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/toolwire/toolwire/worker"
)

// In is upper's input; its JSON Schema is derived from it (the jsonschema
// tag is what the model reads about the field).
type In struct {
	Text string `json:"text" jsonschema:"the text to upper-case"`
}

// Out is upper's output.
type Out struct {
	Text string `json:"text"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	upper := worker.Func(worker.Def{
		Name: "upper", Version: "1.0.0", Description: "Upper-cases a text.",
		SideEffects: worker.SideEffectsNone, Queue: "text",
	}, func(_ context.Context, in In) (Out, error) {
		return Out{Text: strings.ToUpper(in.Text)}, nil
	})
	// Run registers upper@1.0.0 and serves its calls until ctx ends.
	return worker.New(worker.Config{}, upper).Run(ctx)
}
