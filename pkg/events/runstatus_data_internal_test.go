package events

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	fastjson "github.com/segmentio/encoding/json"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// runStatusData has RunStatus's fields, in its order, with its tags and
// types, but for the outputs' type: a field added to one and not the other
// fails here.
func TestRunStatusDataIsRunStatus(t *testing.T) {
	a, b := reflect.TypeFor[RunStatus](), reflect.TypeFor[runStatusData]()
	require.Equal(t, a.NumField(), b.NumField())
	for i := range a.NumField() {
		fa, fb := a.Field(i), b.Field(i)
		require.Equal(t, fa.Name, fb.Name)
		require.Equal(t, fa.Tag, fb.Tag, fa.Name)
		if fa.Name == "Outputs" {
			require.Equal(t, reflect.TypeFor[*plainOutputs](), fb.Type)
			continue
		}
		require.Equal(t, fa.Type, fb.Type, fa.Name)
	}
}

// A completed run's event carries the bytes encoding/json writes for its
// RunStatus, empty outputs included.
func TestRunStatusDataEncodesAsRunStatus(t *testing.T) {
	now := time.Date(2026, 11, 27, 10, 0, 0, 123456789, time.UTC)
	env := envelope.ToolEnvelope{CallID: "c1", Name: "echo", Version: "1.0.0", Input: json.RawMessage(`{"text": "<a&b>"}`),
		Output: json.RawMessage(`{"text":"0"}`), TStart: now, TEnd: now}
	full := envelope.NewAgentOutputs("done", []envelope.ToolEnvelope{env}, "http://t/?a=1&b=2")
	for name, s := range map[string]RunStatus{
		"outputs":       {RunID: "r1", Status: StatusCompleted, Outputs: &full, Pinned: map[string]*envelope.ToolEnvelope{"p": &env}, Turn: &Turn{RunID: "r1", Iteration: 2}},
		"empty outputs": {RunID: "r1", Status: StatusCompleted, Outputs: &envelope.AgentOutputs{}},
		"no outputs":    {RunID: "r1", Status: StatusFailed, Reason: "x", Code: envelope.CodeTimeout},
	} {
		want, err := json.Marshal(s)
		require.NoError(t, err)
		out, err := NewRunStatus("/test", s, "", RunTrace{})
		require.NoError(t, err, name)
		require.Equal(t, string(want), string(out.Event.Data()), name)
	}
}

func FuzzRunStatusData(f *testing.F) {
	f.Add([]byte(`{"run_id":"r","status":"completed","outputs":{"response":"<&>","tools_by_id":{"b":{"call_id":"b","input":{"z" : 1}},"a":{"call_id":"a","input":null,"t_start":"2026-01-02T03:04:05.5Z"}},"tool_order":["b"]},"pinned":{"x":null},"spend":1e21,"turn":{"run_id":"r","iteration":1}}`))
	f.Add([]byte(`{"outputs":{}}`))
	f.Add([]byte(`{"outputs":null,"warnings":["\u2028"]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var s RunStatus
		if json.Unmarshal(data, &s) != nil {
			return
		}
		want, werr := json.Marshal(s)
		got, err := fastjson.Marshal(s.dataOf())
		if werr != nil {
			require.Error(t, err)
			return
		}
		require.NoError(t, err)
		require.Equal(t, string(want), string(got))
	})
}
