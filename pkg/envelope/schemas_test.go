package envelope_test

import (
	"encoding/json"
	"errors"
	"io/fs"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
)

var schemaNames = []string{
	envelope.SchemaAgentOutputs,
	envelope.SchemaToolEnvelope,
	envelope.SchemaToolError,
	envelope.SchemaToolDefinition,
	envelope.SchemaRunRequest,
	envelope.SchemaPinnedHandle,
	envelope.SchemaReplayBundle,
}

func newSchemas(t testing.TB) *envelope.Schemas {
	t.Helper()
	s, err := envelope.NewSchemas(nil)
	require.NoError(t, err)
	return s
}

func marshal(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// readSchema decodes one shipped schema file.
func readSchema(t testing.TB, name string) map[string]any {
	t.Helper()
	b, err := fs.ReadFile(envelope.SchemaFS(), name+".schema.json")
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(b, &doc))
	return doc
}

func TestSchemaFilesAreComplete(t *testing.T) {
	entries, err := fs.ReadDir(envelope.SchemaFS(), ".")
	require.NoError(t, err)
	var files []string
	for _, e := range entries {
		files = append(files, e.Name())
	}
	var want []string
	for _, n := range schemaNames {
		want = append(want, n+".schema.json")
	}
	sort.Strings(want)
	require.Equal(t, want, files, "one schema file per contract, nothing else")

	for _, n := range schemaNames {
		t.Run(n, func(t *testing.T) {
			doc := readSchema(t, n)
			require.Equal(t, "https://json-schema.org/draft/2020-12/schema", doc["$schema"])
			// The URL names the schema (it is the dataschema of the events its
			// data fills); the file has no $id, so that its relative $refs resolve
			// against where it lies, on disk as well as at that URL.
			require.Equal(t, "https://toolwire.dev/schemas/"+n+".schema.json", envelope.SchemaURL(n))
			require.NotContains(t, doc, "$id")
			require.NotEmpty(t, doc["title"])
			require.NotEmpty(t, doc["description"])
			require.Equal(t, "object", doc["type"])
			require.Equal(t, false, doc["additionalProperties"], "every contract is a closed object")
		})
	}
	newSchemas(t) // every $ref resolves
}

// at walks a decoded schema document along keys.
func at(t testing.TB, doc any, path ...string) any {
	t.Helper()
	cur := doc
	for _, k := range path {
		m, ok := cur.(map[string]any)
		require.True(t, ok, "%v: %q is not under an object", path, k)
		cur, ok = m[k]
		require.True(t, ok, "%v: no %q", path, k)
	}
	return cur
}

func enumOf(t testing.TB, doc any, path ...string) []string {
	t.Helper()
	var out []string
	for _, v := range at(t, doc, append(path, "enum")...).([]any) {
		out = append(out, v.(string))
	}
	return out
}

func strs[T ~string](vs ...T) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = string(v)
	}
	return out
}

// TestSchemaEnumsMatchGo keeps the schema enums and the Go constants in step.
func TestSchemaEnumsMatchGo(t *testing.T) {
	te := readSchema(t, envelope.SchemaToolError)
	env := readSchema(t, envelope.SchemaToolEnvelope)
	def := readSchema(t, envelope.SchemaToolDefinition)
	req := readSchema(t, envelope.SchemaRunRequest)
	pin := readSchema(t, envelope.SchemaPinnedHandle)

	tests := []struct {
		name string
		got  []string
		want []string
	}{
		{"error codes", enumOf(t, te, "properties", "code"), strs(envelope.ErrorCodes()...)},
		{"attachment kinds", enumOf(t, env, "$defs", "attachment", "properties", "kind"), strs(envelope.AttachmentBlob, envelope.AttachmentImage, envelope.AttachmentTable)},
		{"categories", enumOf(t, def, "properties", "metadata", "properties", "category"), strs(envelope.CategoryAPI, envelope.CategoryCode, envelope.CategoryData, envelope.CategorySearch, envelope.CategoryUtility)},
		{"side effects", enumOf(t, def, "$defs", "side_effects"), strs(envelope.SideEffectsNone, envelope.SideEffectsReads, envelope.SideEffectsWrites)},
		{"cache policies", enumOf(t, def, "properties", "metadata", "properties", "cache"), strs(envelope.CacheNone, envelope.CacheTTL, envelope.CacheForever)},
		{"implementation kinds", enumOf(t, def, "properties", "implementation", "properties", "kind"), strs(envelope.ImplBuiltin, envelope.ImplHTTP, envelope.ImplMCP, envelope.ImplSandbox)},
		{"roles", enumOf(t, req, "$defs", "message", "properties", "role"), strs(envelope.RoleSystem, envelope.RoleUser, envelope.RoleAssistant, envelope.RoleTool)},
		{"pin strategies", enumOf(t, pin, "properties", "selector", "properties", "strategy"), strs(envelope.PinLatest, envelope.PinFirstSuccess, envelope.PinByCallID)},
		{"on_missing", enumOf(t, pin, "properties", "on_missing"), strs(envelope.MissingNull, envelope.MissingError, envelope.MissingStaleLastSuccess)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, tc.got)
		})
	}
	require.Len(t, envelope.ErrorCodes(), 9)
}

func TestSchemasAcceptRealPayloads(t *testing.T) {
	s := newSchemas(t)
	envs := fixtureEnvelopes(t)
	full := envelope.NewAgentOutputs("It is sunny in Paris.", envs, "https://traces.example.com/trace/4bf92f3577b34da6a3ce929d0e0e4736")
	req := fixtureRunRequest(t)

	minimalReq := envelope.RunRequest{
		RunID:    "r",
		Tenant:   envelope.Tenant{OrgID: "o"},
		Agent:    envelope.Agent{Name: "a", Model: envelope.Model{Provider: "scripted"}},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "hi"}},
	}
	require.NoError(t, minimalReq.Validate())

	refused := envelope.ToolEnvelope{
		CallID: mustCallID(t, "not_enabled", "", `{}`, 1),
		Name:   "not_enabled",
		Input:  json.RawMessage(`{}`),
		Error:  envelope.NewToolError(envelope.CodePolicyDenied, "tool not_enabled is not enabled"),
		TStart: t0,
		TEnd:   t0,
	}
	withTZ := envs[0]
	withTZ.TStart = withTZ.TStart.In(fixedZone)
	withTZ.TEnd = withTZ.TEnd.In(fixedZone)
	nullInput := envs[1]
	nullInput.Input = nil // marshals as "input": null

	tests := []struct {
		name   string
		schema string
		value  any
	}{
		{"full agent outputs", envelope.SchemaAgentOutputs, full},
		{"empty agent outputs", envelope.SchemaAgentOutputs, envelope.NewAgentOutputs("", nil, "")},
		{"zero agent outputs", envelope.SchemaAgentOutputs, envelope.AgentOutputs{}},
		{"only failures", envelope.SchemaAgentOutputs, envelope.NewAgentOutputs("gave up", envs[4:], "")},
		{"success envelope", envelope.SchemaToolEnvelope, envs[0]},
		{"cached envelope", envelope.SchemaToolEnvelope, envs[1]},
		{"truncated envelope", envelope.SchemaToolEnvelope, envs[2]},
		{"envelope with attachments", envelope.SchemaToolEnvelope, envs[3]},
		{"failed envelope with details", envelope.SchemaToolEnvelope, envs[4]},
		{"refused envelope without version", envelope.SchemaToolEnvelope, refused},
		{"timestamps with offset", envelope.SchemaToolEnvelope, withTZ},
		{"null input", envelope.SchemaToolEnvelope, nullInput},
		{"tool error", envelope.SchemaToolError, envs[4].Error},
		{"bare tool error", envelope.SchemaToolError, envelope.NewToolError(envelope.CodeUnknown, "boom")},
		{"run request with pins", envelope.SchemaRunRequest, req},
		{"minimal run request", envelope.SchemaRunRequest, minimalReq},
		{"tool definition", envelope.SchemaToolDefinition, fixtureToolDefinition()},
		{"replay bundle", envelope.SchemaReplayBundle, fixtureReplayBundle(t)},
		{"minimal replay bundle", envelope.SchemaReplayBundle, envelope.ReplayBundle{RunID: "r", Request: minimalReq}},
	}
	for i, p := range req.Agent.PinnedHandles {
		tests = append(tests, struct {
			name   string
			schema string
			value  any
		}{"pin " + strconv.Itoa(i) + " " + p.Name, envelope.SchemaPinnedHandle, p})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw := marshal(t, tc.value)
			require.NoError(t, s.Validate(tc.schema, raw), "%s", raw)
			require.NoError(t, s.ValidateValue(tc.schema, tc.value))
		})
	}
}

// deleted marks a patch that removes the member at its path.
type deleted struct{}

type edit struct {
	path  string // JSON Pointer
	value any    // deleted{} removes
}

// patch decodes raw, applies the edits and re-encodes it.
func patch(t testing.TB, raw []byte, edits ...edit) []byte {
	t.Helper()
	var doc any
	require.NoError(t, json.Unmarshal(raw, &doc))
	for _, e := range edits {
		keys := strings.Split(strings.TrimPrefix(e.path, "/"), "/")
		parent := doc
		for _, k := range keys[:len(keys)-1] {
			switch p := parent.(type) {
			case map[string]any:
				parent = p[k]
			case []any:
				i, err := strconv.Atoi(k)
				require.NoError(t, err)
				parent = p[i]
			default:
				t.Fatalf("patch %s: cannot descend into %T at %q", e.path, parent, k)
			}
		}
		last := keys[len(keys)-1]
		switch p := parent.(type) {
		case map[string]any:
			if _, del := e.value.(deleted); del {
				require.Contains(t, p, last, "patch %s", e.path)
				delete(p, last)
			} else {
				p[last] = e.value
			}
		case []any:
			i, err := strconv.Atoi(last)
			require.NoError(t, err)
			p[i] = e.value
		default:
			t.Fatalf("patch %s: parent is %T", e.path, parent)
		}
	}
	return marshal(t, doc)
}

func TestSchemasRejectBrokenPayloads(t *testing.T) {
	s := newSchemas(t)
	envs := fixtureEnvelopes(t)
	outputs := marshal(t, envelope.NewAgentOutputs("done", envs, "https://traces.example.com/t/1"))
	okID, cachedID, truncID, failID := envs[0].CallID, envs[1].CallID, envs[2].CallID, envs[4].CallID
	envelopeRaw := marshal(t, envs[0])
	failedRaw := marshal(t, envs[4])
	request := marshal(t, fixtureRunRequest(t))
	definition := marshal(t, fixtureToolDefinition())
	bundle := marshal(t, fixtureReplayBundle(t))
	pin := marshal(t, fixturePins(t, "")[0])
	toolErr := marshal(t, envs[4].Error)
	upperID := strings.ToUpper(okID)

	tests := []struct {
		name   string
		schema string
		raw    []byte
		edits  []edit
		loc    string // the location the problems must mention
		msg    string // and a fragment of the message there
	}{
		// agent_outputs
		{"outputs: missing tools_by_id", envelope.SchemaAgentOutputs, outputs, []edit{{"/tools_by_id", deleted{}}}, "at /:", "tools_by_id"},
		{"outputs: missing response", envelope.SchemaAgentOutputs, outputs, []edit{{"/response", deleted{}}}, "at /:", "response"},
		{"outputs: null tool_order", envelope.SchemaAgentOutputs, outputs, []edit{{"/tool_order", nil}}, "at /tool_order:", "want array"},
		{"outputs: bad call_id in tool_order", envelope.SchemaAgentOutputs, outputs, []edit{{"/tool_order/1", "abc"}}, "at /tool_order/1:", "pattern"},
		{"outputs: duplicate call_id in tool_order", envelope.SchemaAgentOutputs, outputs, []edit{{"/tool_order/1", okID}}, "at /tool_order:", "equal"},
		{"outputs: key is not a call_id", envelope.SchemaAgentOutputs, outputs, []edit{{"/tools_by_id/" + upperID, mustDecode(t, envelopeRaw)}}, "at /tools_by_id:", upperID},
		{"outputs: wrong error code", envelope.SchemaAgentOutputs, outputs, []edit{{"/tools_by_id/" + failID + "/error/code", "OOPS"}}, "at /tools_by_id/" + failID + "/error/code:", "RATE_LIMIT"},
		{"outputs: envelope extra property", envelope.SchemaAgentOutputs, outputs, []edit{{"/tools_by_id/" + okID + "/secret", "hunter2"}}, "at /tools_by_id/" + okID + ":", "secret"},
		{"outputs: cached is a string", envelope.SchemaAgentOutputs, outputs, []edit{{"/tools_by_id/" + cachedID + "/cached", "yes"}}, "at /tools_by_id/" + cachedID + "/cached:", "want boolean"},
		{"outputs: truncated without blob", envelope.SchemaAgentOutputs, outputs, []edit{{"/tools_by_id/" + truncID + "/attachments/0/kind", "image"}}, "at /tools_by_id/" + truncID + "/attachments/0/kind:", "blob"},
		{"outputs: truncated without attachments", envelope.SchemaAgentOutputs, outputs, []edit{{"/tools_by_id/" + truncID + "/attachments", deleted{}}}, "at /tools_by_id/" + truncID + ":", "attachments"},
		{"outputs: last_tool failed", envelope.SchemaAgentOutputs, outputs, []edit{{"/last_tool", mustDecode(t, failedRaw)}}, "at /last_tool/error:", "'not' failed"},
		{"outputs: extra property", envelope.SchemaAgentOutputs, outputs, []edit{{"/status", "ok"}}, "at /:", "status"},
		{"outputs: response is a number", envelope.SchemaAgentOutputs, outputs, []edit{{"/response", 42}}, "at /response:", "want string"},

		// tool_envelope
		{"envelope: attempt zero", envelope.SchemaToolEnvelope, envelopeRaw, []edit{{"/attempt", 0}}, "at /attempt:", "minimum"},
		{"envelope: attempt fractional", envelope.SchemaToolEnvelope, envelopeRaw, []edit{{"/attempt", 1.5}}, "at /attempt:", "want integer"},
		{"envelope: missing call_id", envelope.SchemaToolEnvelope, envelopeRaw, []edit{{"/call_id", deleted{}}}, "at /:", "call_id"},
		{"envelope: missing input", envelope.SchemaToolEnvelope, envelopeRaw, []edit{{"/input", deleted{}}}, "at /:", "input"},
		{"envelope: missing t_end", envelope.SchemaToolEnvelope, envelopeRaw, []edit{{"/t_end", deleted{}}}, "at /:", "t_end"},
		{"envelope: uppercase call_id", envelope.SchemaToolEnvelope, envelopeRaw, []edit{{"/call_id", upperID}}, "at /call_id:", "pattern"},
		{"envelope: short call_id", envelope.SchemaToolEnvelope, envelopeRaw, []edit{{"/call_id", okID[:63]}}, "at /call_id:", "pattern"},
		{"envelope: call_id is a number", envelope.SchemaToolEnvelope, envelopeRaw, []edit{{"/call_id", 7}}, "at /call_id:", "want string"},
		{"envelope: bad tool name", envelope.SchemaToolEnvelope, envelopeRaw, []edit{{"/name", "web search"}}, "at /name:", "pattern"},
		{"envelope: bad version", envelope.SchemaToolEnvelope, envelopeRaw, []edit{{"/version", "1.2"}}, "at /version:", "pattern"},
		{"envelope: empty version without error", envelope.SchemaToolEnvelope, envelopeRaw, []edit{{"/version", ""}}, "at /:", "error"},
		{"envelope: timestamp not RFC 3339", envelope.SchemaToolEnvelope, envelopeRaw, []edit{{"/t_start", "14/03/2025 09:26"}}, "at /t_start:", "date-time"},
		{"envelope: timestamp is a number", envelope.SchemaToolEnvelope, envelopeRaw, []edit{{"/t_end", 1741944413}}, "at /t_end:", "want string"},
		{"envelope: attachment kind", envelope.SchemaToolEnvelope, envelopeRaw, []edit{{"/attachments", []any{map[string]any{"kind": "video", "url": "https://x"}}}}, "at /attachments/0/kind:", "blob"},
		{"envelope: attachment without url", envelope.SchemaToolEnvelope, envelopeRaw, []edit{{"/attachments", []any{map[string]any{"kind": "blob"}}}}, "at /attachments/0:", "url"},
		{"envelope: attachment negative bytes", envelope.SchemaToolEnvelope, envelopeRaw, []edit{{"/attachments", []any{map[string]any{"kind": "blob", "url": "/b", "bytes": -1}}}}, "at /attachments/0/bytes:", "minimum"},
		{"envelope: attachment extra property", envelope.SchemaToolEnvelope, envelopeRaw, []edit{{"/attachments", []any{map[string]any{"kind": "blob", "url": "/b", "sha": "x"}}}}, "at /attachments/0:", "sha"},
		{"envelope: error and output", envelope.SchemaToolEnvelope, failedRaw, []edit{{"/output", map[string]any{"partial": true}}}, "at /output:", "want null"},
		{"envelope: error without message", envelope.SchemaToolEnvelope, failedRaw, []edit{{"/error/message", deleted{}}}, "at /error:", "message"},

		// tool_error
		{"error: unknown code", envelope.SchemaToolError, toolErr, []edit{{"/code", "TEAPOT"}}, "at /code:", "VALIDATION_ERROR"},
		{"error: lowercase code", envelope.SchemaToolError, toolErr, []edit{{"/code", "timeout"}}, "at /code:", "TIMEOUT"},
		{"error: negative retry", envelope.SchemaToolError, toolErr, []edit{{"/retry_after_s", -1}}, "at /retry_after_s:", "minimum"},
		{"error: retry is a string", envelope.SchemaToolError, toolErr, []edit{{"/retry_after_s", "10s"}}, "at /retry_after_s:", "want number"},
		{"error: extra property", envelope.SchemaToolError, toolErr, []edit{{"/stack", "..."}}, "at /:", "stack"},

		// run_request
		{"request: run_id with a dot", envelope.SchemaRunRequest, request, []edit{{"/run_id", "run.1"}}, "at /run_id:", "pattern"},
		{"request: run_id with a wildcard", envelope.SchemaRunRequest, request, []edit{{"/run_id", "run>"}}, "at /run_id:", "pattern"},
		{"request: run_id too long", envelope.SchemaRunRequest, request, []edit{{"/run_id", strings.Repeat("a", 65)}}, "at /run_id:", "pattern"},
		{"request: empty run_id", envelope.SchemaRunRequest, request, []edit{{"/run_id", ""}}, "at /run_id:", "pattern"},
		{"request: missing run_id", envelope.SchemaRunRequest, request, []edit{{"/run_id", deleted{}}}, "at /:", "run_id"},
		{"request: missing tenant", envelope.SchemaRunRequest, request, []edit{{"/tenant", deleted{}}}, "at /:", "tenant"},
		{"request: blank org", envelope.SchemaRunRequest, request, []edit{{"/tenant/org_id", "  "}}, "at /tenant/org_id:", "pattern"},
		{"request: empty messages", envelope.SchemaRunRequest, request, []edit{{"/messages", []any{}}}, "at /messages:", "minItems"},
		{"request: unknown role", envelope.SchemaRunRequest, request, []edit{{"/messages/1/role", "robot"}}, "at /messages/1/role:", "assistant"},
		{"request: tool call without arguments", envelope.SchemaRunRequest, request, []edit{{"/messages/2/tool_calls/0/arguments", deleted{}}}, "at /messages/2/tool_calls/0:", "arguments"},
		{"request: enabled tool without version", envelope.SchemaRunRequest, request, []edit{{"/agent/enabled_tools/0", "web_search"}}, "at /agent/enabled_tools/0:", "pattern"},
		{"request: enabled tool bad version", envelope.SchemaRunRequest, request, []edit{{"/agent/enabled_tools/1", "calculator@v2"}}, "at /agent/enabled_tools/1:", "pattern"},
		{"request: enabled_tools is a string", envelope.SchemaRunRequest, request, []edit{{"/agent/enabled_tools", "web_search@1.2.0"}}, "at /agent/enabled_tools:", "want null or array"},
		{"request: missing model provider", envelope.SchemaRunRequest, request, []edit{{"/agent/model/provider", deleted{}}}, "at /agent/model:", "provider"},
		{"request: policy side_effects", envelope.SchemaRunRequest, request, []edit{{"/agent/policy/side_effects", "delete"}}, "at /agent/policy/side_effects:", "writes"},
		{"request: negative max_iterations", envelope.SchemaRunRequest, request, []edit{{"/agent/policy/max_iterations", -1}}, "at /agent/policy/max_iterations:", "minimum"},
		{"request: fractional max_tool_calls", envelope.SchemaRunRequest, request, []edit{{"/agent/policy/max_tool_calls", 2.5}}, "at /agent/policy/max_tool_calls:", "want integer"},
		{"request: agent extra property", envelope.SchemaRunRequest, request, []edit{{"/agent/tools", []any{}}}, "at /agent:", "tools"},
		{"request: pin by_call_id without call_id", envelope.SchemaRunRequest, request, []edit{{"/agent/pinned_handles/2/selector/call_id", deleted{}}}, "at /agent/pinned_handles/2/selector:", "call_id"},
		{"request: pin on_missing", envelope.SchemaRunRequest, request, []edit{{"/agent/pinned_handles/0/on_missing", "ignore"}}, "at /agent/pinned_handles/0/on_missing:", "stale_last_success"},
		{"request: metadata value not a string", envelope.SchemaRunRequest, request, []edit{{"/metadata/node", 3}}, "at /metadata/node:", "want string"},

		// tool_definition
		{"definition: unknown category", envelope.SchemaToolDefinition, definition, []edit{{"/metadata/category", "misc"}}, "at /metadata/category:", "utility"},
		{"definition: unknown side_effects", envelope.SchemaToolDefinition, definition, []edit{{"/metadata/side_effects", "deletes"}}, "at /metadata/side_effects:", "writes"},
		{"definition: unknown cache", envelope.SchemaToolDefinition, definition, []edit{{"/metadata/cache", "always"}}, "at /metadata/cache:", "forever"},
		{"definition: ttl without cache_ttl_s", envelope.SchemaToolDefinition, definition, []edit{{"/metadata/cache_ttl_s", deleted{}}}, "at /metadata:", "cache_ttl_s"},
		{"definition: cached writes", envelope.SchemaToolDefinition, definition, []edit{{"/metadata/side_effects", "writes"}}, "at /metadata/cache:", "none"},
		{"definition: idempotent reads", envelope.SchemaToolDefinition, definition, []edit{{"/metadata/idempotent", true}}, "at /metadata/side_effects:", "writes"},
		{"definition: idempotent not a boolean", envelope.SchemaToolDefinition, definition, []edit{{"/metadata/idempotent", "yes"}}, "at /metadata/idempotent:", "want boolean"},
		{"definition: missing metadata", envelope.SchemaToolDefinition, definition, []edit{{"/metadata", deleted{}}}, "at /:", "metadata"},
		{"definition: unknown implementation", envelope.SchemaToolDefinition, definition, []edit{{"/implementation/kind", "grpc"}}, "at /implementation/kind:", "sandbox"},
		{"definition: bad name", envelope.SchemaToolDefinition, definition, []edit{{"/name", "web.search"}}, "at /name:", "pattern"},
		{"definition: version with build metadata", envelope.SchemaToolDefinition, definition, []edit{{"/version", "1.2.0+git"}}, "at /version:", "pattern"},
		{"definition: input_schema is a string", envelope.SchemaToolDefinition, definition, []edit{{"/input_schema", "object"}}, "at /input_schema:", "want boolean or object"},
		{"definition: zero timeout", envelope.SchemaToolDefinition, definition, []edit{{"/timeout_ms", 0}}, "at /timeout_ms:", "minimum"},
		{"definition: metadata extra property", envelope.SchemaToolDefinition, definition, []edit{{"/metadata/deprecated", true}}, "at /metadata:", "deprecated"},

		// pinned_handle
		{"pin: name starts with a digit", envelope.SchemaPinnedHandle, pin, []edit{{"/name", "1st"}}, "at /name:", "pattern"},
		{"pin: missing selector.tool", envelope.SchemaPinnedHandle, pin, []edit{{"/selector/tool", deleted{}}}, "at /selector:", "tool"},
		{"pin: unknown strategy", envelope.SchemaPinnedHandle, pin, []edit{{"/selector/strategy", "oldest"}}, "at /selector/strategy:", "first_success"},
		{"pin: call_id with latest", envelope.SchemaPinnedHandle, pin, []edit{{"/selector/call_id", okID}}, "at /selector/call_id:", "'not' failed"},
		{"pin: by_call_id with bad call_id", envelope.SchemaPinnedHandle, pin, []edit{{"/selector/strategy", "by_call_id"}, {"/selector/call_id", "xyz"}}, "at /selector/call_id:", "pattern"},
		{"pin: extra property", envelope.SchemaPinnedHandle, pin, []edit{{"/label", "Weather"}}, "at /:", "label"},

		// replay_bundle
		{"bundle: bad run_id", envelope.SchemaReplayBundle, bundle, []edit{{"/run_id", "a b"}}, "at /run_id:", "pattern"},
		{"bundle: missing turns", envelope.SchemaReplayBundle, bundle, []edit{{"/turns", deleted{}}}, "at /:", "turns"},
		{"bundle: request role", envelope.SchemaReplayBundle, bundle, []edit{{"/request/messages/0/role", "bot"}}, "at /request/messages/0/role:", "assistant"},
		{"bundle: turn without usage", envelope.SchemaReplayBundle, bundle, []edit{{"/turns/0/response/usage", deleted{}}}, "at /turns/0/response:", "usage"},
		{"bundle: negative tokens", envelope.SchemaReplayBundle, bundle, []edit{{"/turns/1/response/usage/output_tokens", -3}}, "at /turns/1/response/usage/output_tokens:", "minimum"},
		{"bundle: turn timestamp", envelope.SchemaReplayBundle, bundle, []edit{{"/turns/1/t_end", "later"}}, "at /turns/1/t_end:", "date-time"},
		{"bundle: envelope error code", envelope.SchemaReplayBundle, bundle, []edit{{"/envelopes/4/error/code", "FAILED"}}, "at /envelopes/4/error/code:", "UNKNOWN"},
		{"bundle: tool definition", envelope.SchemaReplayBundle, bundle, []edit{{"/tools/1/metadata/category", "maths"}}, "at /tools/1/metadata/category:", "utility"},
		{"bundle: outputs", envelope.SchemaReplayBundle, bundle, []edit{{"/outputs/tool_order", nil}}, "at /outputs/tool_order:", "want array"},
		{"bundle: status", envelope.SchemaReplayBundle, bundle, []edit{{"/status", "done"}}, "at /status:", "completed"},
		{"bundle: verdict iteration", envelope.SchemaReplayBundle, bundle, []edit{{"/verdicts/0/iteration", 0}}, "at /verdicts/0/iteration:", "minimum"},
		{"bundle: verdict code", envelope.SchemaReplayBundle, bundle, []edit{{"/verdicts/1/code", "NOPE"}}, "at /verdicts/1/code:", "POLICY_DENIED"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw := patch(t, tc.raw, tc.edits...)
			err := s.Validate(tc.schema, raw)
			require.Error(t, err, "%s", raw)
			require.ErrorIs(t, err, envelope.ErrSchemaViolation)
			var se *envelope.SchemaError
			require.ErrorAs(t, err, &se)
			require.Equal(t, tc.schema, se.Schema)
			require.NotEmpty(t, se.Problems)
			t.Logf("%q", se.Problems)
			require.True(t, slices.ContainsFunc(se.Problems, func(p string) bool {
				return strings.HasPrefix(p, tc.loc) && strings.Contains(p, tc.msg)
			}), "no problem %q ... %q in %q", tc.loc, tc.msg, se.Problems)
			require.Contains(t, err.Error(), tc.schema)
		})
	}
}

func mustDecode(t testing.TB, raw []byte) any {
	t.Helper()
	var v any
	require.NoError(t, json.Unmarshal(raw, &v))
	return v
}

func TestSchemasValidateErrors(t *testing.T) {
	s := newSchemas(t)

	err := s.Validate(envelope.SchemaToolError, []byte(`{"code":`))
	require.ErrorIs(t, err, envelope.ErrInvalidJSON)
	var se *envelope.SchemaError
	require.False(t, errors.As(err, &se), "invalid JSON is not a schema violation")

	err = s.Validate("no_such_schema", []byte(`{}`))
	require.ErrorContains(t, err, `unknown schema "no_such_schema"`)

	err = s.ValidateValue(envelope.SchemaToolError, func() {})
	require.ErrorContains(t, err, "marshal")

	// locations are JSON Pointers: '/' and '~' in keys are escaped
	raw := patch(t, marshal(t, fixtureRunRequest(t)), edit{"/metadata", map[string]any{"a/b~c": 1}})
	err = s.Validate(envelope.SchemaRunRequest, raw)
	require.ErrorAs(t, err, &se)
	require.Equal(t, []string{"at /metadata/a~1b~0c: got number, want string"}, se.Problems)

	// a propertyNames failure names the property
	s2, err := envelope.NewSchemas(map[string][]byte{"names": []byte(`{"type":"object","propertyNames":{"pattern":"^[a-z]+$"}}`)})
	require.NoError(t, err)
	err = s2.Validate("names", []byte(`{"ok":1,"Bad":2}`))
	require.ErrorAs(t, err, &se)
	require.Len(t, se.Problems, 1)
	require.Contains(t, se.Problems[0], `property name "Bad": 'Bad' does not match pattern`)
}

func TestNewSchemasExtra(t *testing.T) {
	extra := map[string][]byte{
		"call_completed": []byte(`{
			"$schema": "https://json-schema.org/draft/2020-12/schema",
			"$id": "https://toolwire.dev/schemas/call_completed.schema.json",
			"$ref": "https://toolwire.dev/schemas/tool_envelope.schema.json"
		}`),
	}
	s, err := envelope.NewSchemas(extra)
	require.NoError(t, err)
	envs := fixtureEnvelopes(t)
	require.NoError(t, s.ValidateValue("call_completed", envs[0]))
	err = s.Validate("call_completed", patch(t, marshal(t, envs[0]), edit{"/call_id", "nope"}))
	var se *envelope.SchemaError
	require.ErrorAs(t, err, &se)
	require.Equal(t, "call_completed", se.Schema)

	// An extra schema reaches a contract the way the files do: as a sibling, or
	// by its path from pkg/events/schemas/.
	s, err = envelope.NewSchemas(map[string][]byte{
		"sibling":   []byte(`{"$ref": "tool_envelope.schema.json"}`),
		"from_pkg":  []byte(`{"$ref": "../../envelope/schemas/tool_envelope.schema.json"}`),
		"call_id":   []byte(`{"$ref": "../../envelope/schemas/tool_envelope.schema.json#/$defs/call_id"}`),
		"not_there": []byte(`{"$ref": "../../events/schemas/tool_envelope.schema.json"}`),
	})
	require.ErrorContains(t, err, "not_there")
	s, err = envelope.NewSchemas(map[string][]byte{
		"sibling":  []byte(`{"$ref": "tool_envelope.schema.json"}`),
		"from_pkg": []byte(`{"$ref": "../../envelope/schemas/tool_envelope.schema.json"}`),
		"call_id":  []byte(`{"$ref": "../../envelope/schemas/tool_envelope.schema.json#/$defs/call_id"}`),
	})
	require.NoError(t, err)
	for _, n := range []string{"sibling", "from_pkg"} {
		require.NoError(t, s.ValidateValue(n, envs[0]), n)
		require.ErrorAs(t, s.Validate(n, patch(t, marshal(t, envs[0]), edit{"/call_id", "nope"})), &se, n)
	}
	require.NoError(t, s.ValidateValue("call_id", envs[0].CallID))
	require.ErrorAs(t, s.ValidateValue("call_id", "nope"), &se)

	_, err = envelope.NewSchemas(map[string][]byte{"broken": []byte(`{`)})
	require.ErrorContains(t, err, "schema broken")
	_, err = envelope.NewSchemas(map[string][]byte{"bad_ref": []byte(`{"$ref":"https://toolwire.dev/schemas/nope.schema.json"}`)})
	require.ErrorContains(t, err, "bad_ref")
}

func TestToolSchemas(t *testing.T) {
	def := fixtureToolDefinition()
	sch, err := envelope.CompileToolSchema("toolwire:tool/web_search@1.2.0/input", def.InputSchema)
	require.NoError(t, err)

	tests := []struct {
		name  string
		input string
		loc   string // empty: valid
	}{
		{"valid", `{"query":"paris","limit":3}`, ""},
		{"missing query", `{"limit":3}`, "at /:"},
		{"wrong type", `{"query":"paris","limit":"3"}`, "at /limit:"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := envelope.ValidateAgainst("web_search@1.2.0", sch, []byte(tc.input))
			if tc.loc == "" {
				require.NoError(t, err)
				return
			}
			var se *envelope.SchemaError
			require.ErrorAs(t, err, &se)
			require.Equal(t, "web_search@1.2.0", se.Schema)
			require.True(t, slices.ContainsFunc(se.Problems, func(p string) bool { return strings.HasPrefix(p, tc.loc) }), "%q", se.Problems)
		})
	}

	err = envelope.ValidateAgainst("web_search@1.2.0", sch, []byte(`{`))
	var se *envelope.SchemaError
	require.ErrorAs(t, err, &se)
	require.Contains(t, se.Problems[0], "not valid JSON")

	_, err = envelope.CompileToolSchema("toolwire:tool/x", []byte(`{"type":`))
	require.ErrorIs(t, err, envelope.ErrInvalidJSON)
	_, err = envelope.CompileToolSchema("toolwire:tool/y", []byte(`{"type":"no-such-type"}`))
	require.Error(t, err)

	// a draft-07 document compiles under its own draft
	_, err = envelope.CompileToolSchema("toolwire:tool/z", []byte(`{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","items":[{"type":"string"}]}`))
	require.NoError(t, err)
}
