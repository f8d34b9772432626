package store

import (
	"errors"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/toolwire/toolwire/pkg/events"
)

// Every type RecordOf spares the json.Valid check has its data checked by
// its decoding: data that is not JSON, or JSON followed by more, is refused.
func TestKnownTypesRefuseDataThatIsNotJSON(t *testing.T) {
	for typ := range decoders {
		for _, data := range []string{`{"run_id":`, `{"run_id":"r"}]`, `nope`} {
			e := event.New()
			e.SetID("x")
			e.SetType(typ)
			e.SetSource("/x")
			e.SetTime(time.Now())
			if err := e.SetData(event.ApplicationJSON, []byte(data)); err != nil {
				t.Fatal(err)
			}
			if _, err := RecordOf(&e, "toolwire.run.r.started"); !errors.Is(err, ErrUndecodable) {
				t.Errorf("%s with data %s: RecordOf = %v; want ErrUndecodable", typ, data, err)
			}
		}
	}
}

// The recorder knows every event type of the table, and only those.
func TestDecodersCoverTheTable(t *testing.T) {
	table := map[string]bool{}
	for _, row := range events.Table() {
		table[row.Type] = true
		if decoders[row.Type] == nil {
			t.Errorf("event type %s has no decoder in RecordOf's map", row.Type)
		}
	}
	for typ := range decoders {
		if !table[typ] {
			t.Errorf("decoder for %s, which events.Table does not have", typ)
		}
	}
}
