package events_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

func fixtureSandboxJob() events.SandboxJob {
	return events.SandboxJob{
		RunID: runID, CallID: callID, Tool: "word_count@1.0.0", TenantID: tenant.ID(),
		Language: events.SandboxPython, Source: "import json,sys\nprint(json.dumps(len(sys.stdin.read())))",
		Input: json.RawMessage(`{"text":"a b"}`), Stdout: events.SandboxStdoutJSON,
		Runtime: events.SandboxRuntimeBwrap, TimeoutMS: 5000, Deadline: t0.Add(6 * time.Second),
		Limits: &events.SandboxLimits{MemoryBytes: 128 << 20, Processes: 16, OutputBytes: 1 << 20},
	}
}

func TestSandboxEvents(t *testing.T) {
	schemas, err := events.NewSchemas()
	require.NoError(t, err)
	sub := "toolwire.sandbox." + runID + "." + callID
	ok := events.SandboxResult{RunID: runID, CallID: callID, Output: json.RawMessage(`{"words":2}`),
		Runtime: events.SandboxRuntimeGVisor, DurationMS: 210, Worker: "sandbox-1"}
	failed := events.SandboxResult{RunID: runID, CallID: callID, Runtime: events.SandboxRuntimeBwrap, ExitCode: 1,
		Error:  envelope.NewToolError(envelope.CodeSandboxError, "memory limit hit").WithDetails(map[string]any{"limit": "memory"}),
		Stderr: "MemoryError", DurationMS: 90}
	mk := func(o events.Outgoing, err error) events.Outgoing {
		t.Helper()
		require.NoError(t, err)
		return o
	}
	cases := []struct {
		name, typ, id, subject string
		out                    events.Outgoing
		data                   any
	}{
		{"job", events.TypeSandboxRequested, runID + "/" + callID + "/sandbox/requested", sub + ".requested",
			mk(events.NewSandboxJob("/toolwire/test", fixtureSandboxJob(), runTrace)), new(events.SandboxJob)},
		{"result", events.TypeSandboxCompleted, runID + "/" + callID + "/sandbox/completed", sub + ".completed",
			mk(events.NewSandboxResult("/toolwire/test", ok, tenant.ID(), runTrace)), new(events.SandboxResult)},
		{"failed result", events.TypeSandboxCompleted, runID + "/" + callID + "/sandbox/completed", sub + ".completed",
			mk(events.NewSandboxResult("/toolwire/test", failed, tenant.ID(), runTrace)), new(events.SandboxResult)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := &c.out.Event
			require.Equal(t, c.subject, c.out.Subject)
			require.Equal(t, c.typ, e.Type())
			require.Equal(t, c.id, e.ID())
			require.Equal(t, envelope.SchemaURL(events.DataSchema(c.typ)), e.DataSchema())
			require.Equal(t, callID, events.Ext(e, events.ExtCallID))
			require.Equal(t, tenant.ID(), events.Ext(e, events.ExtTenantID))
			require.NoError(t, schemas.Validate(events.DataSchema(c.typ), e.Data()))

			m, err := events.Encode(c.out.Subject, e)
			require.NoError(t, err)
			require.Equal(t, c.id, m.Header.Get(events.HeaderMsgID))
			got, err := events.Decode(m)
			require.NoError(t, err)
			requireSameEvent(t, e, got)
			require.NoError(t, events.DecodeData(got, c.data))
			p, err := events.ParseSubject(c.subject)
			require.NoError(t, err)
			require.Equal(t, "sandbox", p.Kind)
			require.Equal(t, callID, p.CallID)
		})
	}
}

func TestSandboxJobRejects(t *testing.T) {
	cases := []struct {
		name string
		edit func(*events.SandboxJob)
		msg  string
	}{
		{"unsafe run id", func(j *events.SandboxJob) { j.RunID = "a.b" }, "unsafe subject token"},
		{"call id not hex", func(j *events.SandboxJob) { j.CallID = "XYZ" }, "must be lowercase hex"},
		{"tool ref", func(j *events.SandboxJob) { j.Tool = "word_count" }, "want name@version"},
		{"tenant", func(j *events.SandboxJob) { j.TenantID = "" }, "tenant_id is required"},
		{"language", func(j *events.SandboxJob) { j.Language = "ruby" }, `language "ruby" is not supported`},
		{"empty source", func(j *events.SandboxJob) { j.Source = "  \n" }, "source is empty"},
		{"huge source", func(j *events.SandboxJob) { j.Source = string(make([]byte, events.SandboxMaxSourceBytes+1)) }, "more than"},
		{"input not JSON", func(j *events.SandboxJob) { j.Input = json.RawMessage(`{`) }, "input must be a JSON value"},
		{"stdout mode", func(j *events.SandboxJob) { j.Stdout = "binary" }, `stdout "binary"`},
		{"runtime", func(j *events.SandboxJob) { j.Runtime = events.SandboxRuntimeInsecureDev }, `runtime "insecure-dev" is not one of`},
		{"timeout", func(j *events.SandboxJob) { j.TimeoutMS = 0 }, "timeout_ms must be positive"},
		{"deadline", func(j *events.SandboxJob) { j.Deadline = time.Time{} }, "deadline is required"},
		{"negative limit", func(j *events.SandboxJob) { j.Limits.Processes = -1 }, "must not be negative"},
	}
	schemas, err := events.NewSchemas()
	require.NoError(t, err)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			j := fixtureSandboxJob()
			c.edit(&j)
			_, err := events.NewSandboxJob("/s", j, events.RunTrace{})
			require.ErrorIs(t, err, events.ErrInvalidEvent)
			require.ErrorContains(t, err, c.msg)
			// The schema refuses the same data, except what only Go tells: a
			// whitespace-only source, a zero deadline (a valid date-time), and
			// broken input (json.Marshal itself refuses a broken RawMessage).
			switch c.name {
			case "empty source", "deadline", "input not JSON":
			default:
				b, err := json.Marshal(j)
				require.NoError(t, err)
				require.ErrorIs(t, schemas.Validate(events.SchemaSandboxJob, b), envelope.ErrSchemaViolation)
			}
		})
	}
}

func TestSandboxResultRejects(t *testing.T) {
	cases := []struct {
		name string
		r    events.SandboxResult
		msg  string
	}{
		{"neither", events.SandboxResult{RunID: runID, CallID: callID}, "neither output nor error"},
		{"null output", events.SandboxResult{RunID: runID, CallID: callID, Output: json.RawMessage("null")}, "neither output nor error"},
		{"both", events.SandboxResult{RunID: runID, CallID: callID, Output: json.RawMessage("1"),
			Error: envelope.NewToolError(envelope.CodeSandboxError, "x")}, "both output and error"},
		{"wrong code", events.SandboxResult{RunID: runID, CallID: callID,
			Error: envelope.NewToolError(envelope.CodeNetworkError, "x")}, `error code "NETWORK_ERROR"`},
		{"negative duration", events.SandboxResult{RunID: runID, CallID: callID, Output: json.RawMessage("1"), DurationMS: -1}, "duration_ms"},
		{"unsafe id", events.SandboxResult{RunID: "../x", CallID: callID, Output: json.RawMessage("1")}, "unsafe subject token"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := events.NewSandboxResult("/s", c.r, tenant.ID(), events.RunTrace{})
			require.ErrorIs(t, err, events.ErrInvalidEvent)
			require.ErrorContains(t, err, c.msg)
		})
	}
}

func TestParseSandboxToolConfig(t *testing.T) {
	def := func(kind envelope.ImplementationKind, cfg string) *envelope.ToolDefinition {
		return &envelope.ToolDefinition{Name: "t", Version: "1.0.0", Implementation: envelope.Implementation{Kind: kind, Config: json.RawMessage(cfg)}}
	}
	got, err := events.ParseSandboxToolConfig(def(envelope.ImplSandbox, `{"language":"python","source":"print(1)","runtime":"gvisor","limits":{"memory_bytes":1048576}}`))
	require.NoError(t, err)
	require.Equal(t, events.SandboxToolConfig{Language: "python", Source: "print(1)", Runtime: "gvisor",
		Limits: &events.SandboxLimits{MemoryBytes: 1 << 20}}, got)

	got, err = events.ParseSandboxToolConfig(def(envelope.ImplSandbox, `{"language":"python","code_from_input":true}`))
	require.NoError(t, err)
	require.True(t, got.CodeFromInput)

	for _, c := range []struct {
		name string
		def  *envelope.ToolDefinition
		msg  string
	}{
		{"kind", def(envelope.ImplBuiltin, `{}`), `kind "builtin" is not sandbox`},
		{"no config", def(envelope.ImplSandbox, ``), "EOF"},
		{"unknown field", def(envelope.ImplSandbox, `{"language":"python","source":"x","network":true}`), `unknown field "network"`},
		{"language", def(envelope.ImplSandbox, `{"language":"js","source":"x"}`), `language "js"`},
		{"no source", def(envelope.ImplSandbox, `{"language":"python"}`), "source is required"},
		{"both", def(envelope.ImplSandbox, `{"language":"python","source":"x","code_from_input":true}`), "exclude each other"},
		{"runtime", def(envelope.ImplSandbox, `{"language":"python","source":"x","runtime":"docker"}`), `runtime "docker"`},
		{"limits", def(envelope.ImplSandbox, `{"language":"python","source":"x","limits":{"disk_bytes":-5}}`), "must not be negative"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := events.ParseSandboxToolConfig(c.def)
			require.ErrorContains(t, err, c.msg)
			require.ErrorContains(t, err, "t@1.0.0", "the error names the tool")
		})
	}
}

// FuzzSandboxJobData decodes arbitrary bytes as a sandbox job's data the way
// the sandbox service does: never a panic, and whatever Validate accepts
// builds an event whose data the schema accepts.
func FuzzSandboxJobData(f *testing.F) {
	good, err := json.Marshal(fixtureSandboxJob())
	require.NoError(f, err)
	f.Add(good)
	f.Add([]byte(`{"run_id":"r","call_id":"ab","tool":"t@1.0.0","tenant_id":"o//","language":"python","source":"x","input":null,"stdout":"text","timeout_ms":1,"deadline":"2025-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"input":{}}`))
	f.Add([]byte(`[]`))
	schemas, err := events.NewSchemas()
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, b []byte) {
		var j events.SandboxJob
		if json.Unmarshal(b, &j) != nil || j.Validate() != nil {
			return
		}
		out, err := events.NewSandboxJob("/fuzz", j, events.RunTrace{})
		if err != nil {
			t.Fatalf("a valid job does not build: %v", err)
		}
		if err := schemas.Validate(events.SchemaSandboxJob, out.Event.Data()); err != nil {
			t.Fatalf("a valid job's data fails its schema: %v\n%s", err, out.Event.Data())
		}
	})
}
