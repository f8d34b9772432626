package builtin

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

func TestJSONQuery(t *testing.T) {
	t.Setenv("TOOLWIRE_TEST_SECRET", "must-not-leak")
	cases := []struct {
		name, in string
		want     string // the output, or "" for an error
		code     envelope.ErrorCode
		msg      string
	}{
		{name: "select", in: `{"query":".items[] | select(.price < 10) | .name","input":{"items":[{"name":"tea","price":3},{"name":"cake","price":12},{"name":"bun","price":2}]}}`,
			want: `{"result":["tea","bun"]}`},
		{name: "object construction", in: `{"query":"{total: (map(.n) | add), count: length}","input":[{"n":1},{"n":2.5}]}`,
			want: `{"result":[{"count":2,"total":3.5}]}`},
		{name: "no output", in: `{"query":"empty","input":1}`, want: `{"result":[]}`},
		{name: "absent input is null", in: `{"query":"."}`, want: `{"result":[null]}`},
		{name: "big integers stay exact", in: `{"query":".id","input":{"id":12345678901234567890}}`, want: `{"result":[12345678901234567890]}`},
		{name: "keys", in: `{"query":"keys","input":{"b":1,"a":2}}`, want: `{"result":[["a","b"]]}`},
		{name: "no environment", in: `{"query":"$ENV.TOOLWIRE_TEST_SECRET, env.PATH","input":null}`, want: `{"result":[null,null]}`},
		{name: "halt stops", in: `{"query":"1, halt, 2","input":null}`, want: `{"result":[1]}`},
		{name: "parse error", in: `{"query":".items[","input":{}}`, code: envelope.CodeValidation, msg: "the query does not parse"},
		{name: "unknown function", in: `{"query":"nosuchfn(1)","input":{}}`, code: envelope.CodeValidation, msg: "the query does not compile: function not defined: nosuchfn/1"},
		{name: "runtime type error", in: `{"query":".a + 1","input":{"a":"x"}}`, code: envelope.CodeValidation, msg: "cannot add"},
		{name: "error()", in: `{"query":"error(\"boom\")","input":{}}`, code: envelope.CodeValidation, msg: "boom"},
		{name: "no input()", in: `{"query":"input","input":{}}`, code: envelope.CodeValidation, msg: "json_query"},
		{name: "no modules", in: `{"query":"import \"x\" as x; .","input":{}}`, code: envelope.CodeValidation, msg: "json_query"},
		{name: "too many results", in: `{"query":"range(20000)","input":null}`, code: envelope.CodeValidation, msg: "more than 10000 values"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := jsonQueryTool{}.Execute(t.Context(), json.RawMessage(c.in), toolapi.Context{})
			if c.want != "" {
				require.NoError(t, err)
				require.JSONEq(t, c.want, string(out))
				return
			}
			var te *envelope.ToolError
			require.ErrorAs(t, err, &te)
			require.Equal(t, c.code, te.Code)
			require.Contains(t, te.Message, c.msg)
		})
	}

	// The parse error points at the query's offset.
	_, err := jsonQueryTool{}.Execute(t.Context(), json.RawMessage(`{"query":"[1, 2"}`), toolapi.Context{})
	var te *envelope.ToolError
	require.ErrorAs(t, err, &te)
	require.Equal(t, map[string]any{"offset": 5, "token": "", "query": "[1, 2"}, te.Details)
}

// TestJSONQueryHonoursItsContext: an endless query stops when its context
// ends, with the context's cause (the executor's TIMEOUT).
func TestJSONQueryHonoursItsContext(t *testing.T) {
	errToolTimeout := errors.New("tool timeout") // the executor's cause
	for _, q := range []string{`def f: f; f`, `last(range(infinite))`, `[repeat(1)] | length`} {
		cause := context.DeadlineExceeded
		ctx, cancel := context.WithTimeoutCause(t.Context(), 100*time.Millisecond, errToolTimeout)
		_, err := jsonQueryTool{}.Execute(ctx, json.RawMessage(`{"query":`+mustJSON(q)+`}`), toolapi.Context{})
		cancel()
		require.Error(t, err, q)
		require.ErrorIs(t, err, errToolTimeout, "%s: %v (not %v)", q, err, cause)
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}
