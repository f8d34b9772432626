package envelope_test

import (
	"encoding/json"
	"fmt"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// A call id depends on the tool, its version, the input's canonical JSON and
// the call's place in its run, nothing else: the same input spelled with
// other key order, white space or number spelling has the same id, and the
// same call later in the run another. The first id below is
//
//	sha256("echo@1.0.0" "\n" `{"n":1,"text":"hi"}` "\n" "1")
//
// as `printf 'echo@1.0.0\n{"n":1,"text":"hi"}\n1' | sha256sum` prints it.
func ExampleCallID() {
	a, _ := envelope.CallID("echo", "1.0.0", []byte(`{"text":"hi","n":1}`), 1)
	b, _ := envelope.CallID("echo", "1.0.0", []byte(`{ "n": 1.0, "text": "hi" }`), 1)
	c, _ := envelope.CallID("echo", "1.0.0", []byte(`{"text":"hi","n":1}`), 2)
	fmt.Println(a)
	fmt.Println("same input, other spelling:", a == b)
	fmt.Println("same input, next call:", a == c)
	_, err := envelope.CallID("echo", "1.0.0", []byte(`{"text":`), 1)
	fmt.Println(err)
	// Output:
	// ff4f027912667a8497e8849044bebcaa58e898efeab7b1f5e0a0a307d0e9710f
	// same input, other spelling: true
	// same input, next call: false
	// call id: canonicalize: invalid JSON
}

// Pinned handles name the envelopes an agent node outputs, whatever the run
// did: the last call of a tool, its first success, one call by id; a handle
// whose tool was not called is null (nil), so the node's outputs keep their
// shape.
func ExampleResolvePins() {
	call := func(seq int, text string, failed bool) envelope.ToolEnvelope {
		in := json.RawMessage(fmt.Sprintf(`{"query":%q}`, text))
		id, _ := envelope.CallID("search", "1.0.0", in, seq)
		env := envelope.ToolEnvelope{CallID: id, Name: "search", Version: "1.0.0", Input: in}
		if failed {
			env.Error = envelope.NewToolError(envelope.CodeNetworkError, "search backend unreachable")
		} else {
			env.Output = json.RawMessage(fmt.Sprintf(`{"hits":[%q]}`, text+" result"))
		}
		return env
	}
	// The run called search three times; the first failed.
	calls := []envelope.ToolEnvelope{call(1, "go", true), call(2, "nats", false), call(3, "jetstream", false)}
	out := envelope.NewAgentOutputs("done", calls, "")

	pins := []envelope.PinnedHandle{
		{Name: "latest", Selector: envelope.PinSelector{Tool: "search"}},
		{Name: "first_ok", Selector: envelope.PinSelector{Tool: "search", Strategy: envelope.PinFirstSuccess}},
		{Name: "first", Selector: envelope.PinSelector{Tool: "search", Strategy: envelope.PinByCallID, CallID: calls[0].CallID}},
		{Name: "fetched", Selector: envelope.PinSelector{Tool: "fetch"}}, // never called
	}
	got, err := envelope.ResolvePins(out, pins)
	if err != nil {
		panic(err)
	}
	for _, p := range pins {
		switch env := got[p.Name]; {
		case env == nil:
			fmt.Printf("%s: null\n", p.Name)
		case env.Error != nil:
			fmt.Printf("%s: %s error %s\n", p.Name, env.Input, env.Error.Code)
		default:
			fmt.Printf("%s: %s -> %s\n", p.Name, env.Input, env.Output)
		}
	}

	// With on_missing "error", a handle that selects nothing fails the node.
	_, err = envelope.ResolvePins(out, []envelope.PinnedHandle{
		{Name: "fetched", Selector: envelope.PinSelector{Tool: "fetch"}, OnMissing: envelope.MissingError},
	})
	fmt.Println(err)
	// Output:
	// latest: {"query":"jetstream"} -> {"hits":["jetstream result"]}
	// first_ok: {"query":"nats"} -> {"hits":["nats result"]}
	// first: {"query":"go"} error NETWORK_ERROR
	// fetched: null
	// pinned handle has no matching tool call: handle "fetched" (tool fetch, strategy latest)
}
