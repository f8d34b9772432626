package workertest_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/toolwire/toolwire/worker"
	"github.com/toolwire/toolwire/worker/workertest"
)

// In is upper's input; Out its output.
type In struct {
	Text string `json:"text" jsonschema:"the text to upper-case"`
}

type Out struct {
	Text string `json:"text"`
}

// upper is the tool under test: a Go function declared as a tool.
var upper = worker.Func(worker.Def{
	Name: "upper", Version: "1.0.0", Description: "Upper-cases a text.",
	SideEffects: worker.SideEffectsNone,
}, func(_ context.Context, in In) (Out, error) {
	if in.Text == "" {
		return Out{}, worker.Errorf(worker.CodeValidation, "text is empty: give the text to upper-case")
	}
	return Out{Text: strings.ToUpper(in.Text)}, nil
})

// A test starts the pipeline with a worker serving its tools, has the
// scripted model call them, and reads the envelopes the run returns. In a
// test, t is the test's *testing.T:
//
//	func TestUpper(t *testing.T) {
//		env := workertest.Start(t, worker.Config{Queue: "text"}, upper)
//		...
//	}
//
// An Example has no *testing.T, so this one passes exampleTB, below.
func ExampleStart() {
	t := &exampleTB{name: "ExampleStart"}
	defer t.cleanup() // what the testing package does when a test ends

	env := workertest.Start(t, worker.Config{Queue: "text"}, upper)

	// A run whose model calls upper, then answers.
	res := env.Run(workertest.Calls(workertest.Call("upper", In{Text: "hello"})), workertest.Answer("done"))
	fmt.Println(res.Status, res.Outputs.Response)
	got := res.Envelopes("upper")[0] // the envelope: input, output, error, timings, cost
	fmt.Println(got.ToolRef(), string(got.Input), "->", string(got.Output))

	// Call runs one call in a run of its own: an error of the tool reaches
	// the model (and the envelope) with its code and message.
	failed := env.Call("upper", In{})
	fmt.Println(failed.Error.Code, failed.Error.Message)
	// Input that breaks the tool's schema never reaches the function.
	invalid := env.Call("upper", `{"txt":"hello"}`)
	fmt.Println(invalid.Error.Code)
	// Output:
	// completed done
	// upper@1.0.0 {"text":"hello"} -> {"text":"HELLO"}
	// VALIDATION_ERROR text is empty: give the text to upper-case
	// VALIDATION_ERROR
}

// exampleTB is the testing.TB an Example lacks, with what workertest asks of
// its t: Helper, Name, TempDir, Cleanup, Logf, Errorf and Fatalf. The
// embedded testing.TB is nil: it only supplies the interface's unexported
// method (another method called on it would panic, failing the example).
type exampleTB struct {
	testing.TB
	name     string
	cleanups []func()
}

func (t *exampleTB) Helper()                   {}
func (t *exampleTB) Name() string              { return t.name }
func (t *exampleTB) Cleanup(f func())          { t.cleanups = append(t.cleanups, f) }
func (t *exampleTB) Logf(string, ...any)       {}
func (t *exampleTB) Errorf(f string, a ...any) { fmt.Println("error:", fmt.Sprintf(f, a...)) } // in the output: fails the example
func (t *exampleTB) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }                 // fails the example, after the deferred cleanup

func (t *exampleTB) TempDir() string {
	dir, err := os.MkdirTemp("", "workertest-example-")
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// cleanup runs the cleanups, the last registered first.
func (t *exampleTB) cleanup() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}
