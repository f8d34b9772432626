package dlqtools_test

import (
	"fmt"

	"github.com/toolwire/toolwire/worker/dlqtools"
)

// Tools are the dead-letter tools, for a worker on queue ops whose process
// may read and replay the dead letters (its JetStream).
func ExampleTools() {
	for _, t := range dlqtools.Tools(nil) {
		d, err := t.Definition()
		if err != nil {
			panic(err)
		}
		fmt.Println(d.Ref(), d.Metadata.SideEffects, "on", d.Queue)
	}
	// Output:
	// list_dlq_events@1.0.0 reads on ops
	// get_dlq_event_detail@1.0.0 reads on ops
	// replay_dlq_event@1.0.0 writes on ops
}
