// Command worker serves one tool of your own, upper@1.0.0 on the queue
// "text", beside a running toolwire (`toolwire dev`, or the service
// binaries). It needs only NATS_URL, and beside `toolwire dev` the executor
// role's seed that dev made:
//
//	go run ./cmd/toolwire dev                                   # one shell
//	NATS_URL=nats://127.0.0.1:4223 TOOLWIRE_NATS_NKEY_SEED_FILE=.toolwire/identities/executor.nk \
//	  go run ./examples/worker                                  # another
//	go run ./cmd/toolwire call upper@1.0.0 --input '{"text":"hello"}'
//
// Every call of upper@1.0.0, from a run or from `toolwire call`, is routed to
// the queue "text" and runs here, through the same pipeline as the built-in
// tools (validation, cache, timeouts, truncation, spans, metrics). Start it
// twice and the two share the calls. Stop it with Ctrl-C or SIGTERM: it
// finishes the calls in flight first.
//
// It is the program of the README's "Your own tool in 20 lines", with
// comments (worker/readme_test.go checks that the two stay the same).
package main

import (
	"context"
	"strings"

	"github.com/toolwire/toolwire/worker"
)

// In is upper's input; its JSON Schema is derived from it (the jsonschema
// tag is what the model reads about the field).
type In struct {
	Text string `json:"text" jsonschema:"the text to upper-case"`
}

// Out is upper's output; its JSON Schema is derived from it too, and the
// pipeline checks every output against it.
type Out struct {
	Text string `json:"text"`
}

// upper declares the tool: what the model sees, and what the Policy Guard
// and the pipeline enforce (SideEffects has no default: it must be said).
var upper = worker.Func(worker.Def{
	Name: "upper", Version: "1.0.0", Description: "Upper-cases a text.",
	SideEffects: worker.SideEffectsNone, Queue: "text",
}, func(_ context.Context, in In) (Out, error) {
	return Out{Text: strings.ToUpper(in.Text)}, nil
})

// main registers upper@1.0.0 and serves its calls until SIGINT or SIGTERM,
// then drains the calls in flight; a bad declaration or no NATS exits 1.
func main() { worker.New(worker.Config{}, upper).Main() }
