package events_test

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"net/url"
	"path"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// schemaTree is every schema file of the repository, by its path under pkg/:
// the contracts of pkg/envelope and the event data schemas of pkg/events, the
// two folders a $ref may cross.
func schemaTree(t testing.TB) map[string][]byte {
	t.Helper()
	tree := map[string][]byte{}
	for dir, fsys := range map[string]fs.FS{
		"envelope/schemas": envelope.SchemaFS(),
		"events/schemas":   events.SchemaFS(),
	} {
		names, err := fs.Glob(fsys, "*.schema.json")
		require.NoError(t, err)
		require.NotEmpty(t, names, dir)
		for _, n := range names {
			b, err := fs.ReadFile(fsys, n)
			require.NoError(t, err)
			tree[dir+"/"+n] = b
		}
	}
	return tree
}

// TestSchemasArePortable holds every schema file to what code generators need
// to load it offline: each $ref is relative and names a file of the tree and a
// node in it, no $id moves a file's base off where it lies, and no boolean
// stands where a subschema goes (quicktype refuses a false one), except as
// additionalProperties or unevaluatedProperties, which quicktype and
// json-schema-to-typescript read as whether the object is closed.
func TestSchemasArePortable(t *testing.T) {
	problems := schemaPortabilityProblems(schemaTree(t))
	require.Empty(t, problems, "\n%s", strings.Join(problems, "\n"))
}

// TestSchemaPortabilityProblems shows that the check above finds what it looks
// for.
func TestSchemaPortabilityProblems(t *testing.T) {
	good := `{"$defs": {"a": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/a"}}, "additionalProperties": false}`
	tests := []struct {
		name, doc, want string
	}{
		{"fine", `{"properties": {"x": {"$ref": "good.schema.json#/$defs/a"}, "y": {"$ref": "../../events/schemas/good.schema.json"}}, "unevaluatedProperties": true}`, ""},
		{"false property", `{"properties": {"x": false}}`, "#/properties/x: a boolean subschema"},
		{"true items", `{"items": true}`, "#/items: a boolean subschema"},
		{"false not", `{"not": false}`, "#/not: a boolean subschema"},
		{"false in allOf", `{"allOf": [{}, {"properties": {"x": {"items": [false]}}}]}`, "#/allOf/1/properties/x/items/0: a boolean subschema"},
		{"false else", `{"if": {}, "then": {}, "else": false}`, "#/else: a boolean subschema"},
		{"false def", `{"$defs": {"never": false}}`, "#/$defs/never: a boolean subschema"},
		{"false dependent", `{"dependentSchemas": {"x": false}}`, "#/dependentSchemas/x: a boolean subschema"},
		{"boolean root", `false`, "#: a boolean subschema"},
		{"https ref", `{"$ref": "https://toolwire.dev/schemas/good.schema.json"}`, "#: $ref \"https://toolwire.dev/schemas/good.schema.json\" is absolute"},
		{"http ref", `{"items": {"$ref": "http://example.com/x.json"}}`, "#/items: $ref \"http://example.com/x.json\" is absolute"},
		{"file ref", `{"$ref": "file:///tmp/x.json"}`, "is absolute"},
		{"host ref", `{"$ref": "//toolwire.dev/schemas/good.schema.json"}`, "is absolute"},
		{"rooted ref", `{"$ref": "/schemas/good.schema.json"}`, "is absolute"},
		{"missing file", `{"$ref": "nope.schema.json"}`, "#: $ref \"nope.schema.json\": no file envelope/schemas/nope.schema.json"},
		{"wrong folder", `{"$ref": "../../events/schemas/bad.schema.json"}`, "no file events/schemas/bad.schema.json"},
		{"missing node", `{"$ref": "good.schema.json#/$defs/b"}`, "#: $ref \"good.schema.json#/$defs/b\": no node /$defs/b in envelope/schemas/good.schema.json"},
		{"anchor", `{"$ref": "#a"}`, "#: $ref \"#a\": the fragment is not a JSON Pointer"},
		{"$id", `{"$id": "https://toolwire.dev/schemas/bad.schema.json"}`, "#: an $id"},
		{"nested $id", `{"properties": {"x": {"$id": "x.json"}}}`, "#/properties/x: an $id"},
		{"not JSON", `{`, "not JSON"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := schemaPortabilityProblems(map[string][]byte{
				"envelope/schemas/good.schema.json": []byte(good),
				"events/schemas/good.schema.json":   []byte(good),
				"envelope/schemas/bad.schema.json":  []byte(tc.doc),
			})
			if tc.want == "" {
				require.Empty(t, got)
				return
			}
			require.Len(t, got, 1, "%q", got)
			require.True(t, strings.HasPrefix(got[0], "envelope/schemas/bad.schema.json"), got[0])
			require.Contains(t, got[0], tc.want)
		})
	}
}

// Keywords whose value is a subschema, an object of subschemas, or an array of
// them (draft 2020-12, and the older items/additionalItems/definitions/
// dependencies forms).
var (
	schemaKeywords = map[string]bool{
		"additionalProperties": true, "unevaluatedProperties": true, "propertyNames": true,
		"items": true, "additionalItems": true, "unevaluatedItems": true, "contains": true,
		"not": true, "if": true, "then": true, "else": true, "contentSchema": true,
	}
	schemaMapKeywords   = map[string]bool{"properties": true, "patternProperties": true, "$defs": true, "definitions": true, "dependentSchemas": true, "dependencies": true}
	schemaArrayKeywords = map[string]bool{"allOf": true, "anyOf": true, "oneOf": true, "prefixItems": true, "items": true}
	// A boolean is fine here: generators read it as whether the object is closed.
	booleanKeywords = map[string]bool{"additionalProperties": true, "unevaluatedProperties": true}
)

// schemaPortabilityProblems lists, one line each, what keeps a tree of schema
// files (path to document) from loading offline in a code generator.
func schemaPortabilityProblems(tree map[string][]byte) []string {
	docs := map[string]any{}
	var out []string
	for p, b := range tree {
		var doc any
		if err := json.Unmarshal(b, &doc); err != nil {
			out = append(out, fmt.Sprintf("%s: not JSON: %v", p, err))
			continue
		}
		docs[p] = doc
	}
	for p, doc := range docs {
		var walk func(node any, ptr []string, booleanOK bool)
		walk = func(node any, ptr []string, booleanOK bool) {
			at := p + "#" + pointer(ptr)
			switch n := node.(type) {
			case bool:
				if !booleanOK {
					out = append(out, fmt.Sprintf("%s: a boolean subschema (%v): write {} or {\"not\": {}}", at, n))
				}
				return
			case map[string]any:
				if _, ok := n["$id"]; ok {
					out = append(out, at+": an $id: a schema's base is where its file lies")
				}
				if ref, ok := n["$ref"].(string); ok {
					if problem := checkRef(p, ref, docs); problem != "" {
						out = append(out, fmt.Sprintf("%s: $ref %q%s", at, ref, problem))
					}
				}
				for k, v := range n {
					sub := append(append([]string(nil), ptr...), k)
					if schemaKeywords[k] {
						if _, isArray := v.([]any); !isArray {
							walk(v, sub, booleanKeywords[k])
						}
					}
					if schemaArrayKeywords[k] {
						if vs, ok := v.([]any); ok {
							for i, s := range vs {
								walk(s, append(append([]string(nil), sub...), strconv.Itoa(i)), false)
							}
						}
					}
					if schemaMapKeywords[k] {
						if m, ok := v.(map[string]any); ok {
							for name, s := range m {
								if _, isArray := s.([]any); k == "dependencies" && isArray {
									continue // a list of property names
								}
								walk(s, append(append([]string(nil), sub...), name), false)
							}
						}
					}
				}
			default:
				out = append(out, fmt.Sprintf("%s: a %T where a schema goes", at, node))
			}
		}
		walk(doc, nil, false)
	}
	sort.Strings(out)
	return out
}

// checkRef says what is wrong with a $ref of the file at from, or "".
func checkRef(from, ref string, docs map[string]any) string {
	u, err := url.Parse(ref)
	if err != nil {
		return ": " + err.Error()
	}
	if u.IsAbs() || u.Host != "" || strings.HasPrefix(u.Path, "/") {
		return " is absolute: name the file by its path from this one"
	}
	target := from
	if u.Path != "" {
		target = path.Join(path.Dir(from), u.Path)
	}
	doc, ok := docs[target]
	if !ok {
		return ": no file " + target
	}
	if u.Fragment == "" {
		return ""
	}
	if !strings.HasPrefix(u.Fragment, "/") {
		return ": the fragment is not a JSON Pointer"
	}
	if _, ok := lookupPointer(doc, u.Fragment); !ok {
		return fmt.Sprintf(": no node %s in %s", u.Fragment, target)
	}
	return ""
}

// lookupPointer finds the node at a JSON Pointer ("" or "/a/b") in a document.
func lookupPointer(doc any, ptr string) (any, bool) {
	if ptr == "" {
		return doc, true
	}
	if !strings.HasPrefix(ptr, "/") {
		return nil, false
	}
	node := doc
	for _, tok := range strings.Split(ptr, "/")[1:] {
		tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
		var ok bool
		switch n := node.(type) {
		case map[string]any:
			node, ok = n[tok]
		case []any:
			i, err := strconv.Atoi(tok)
			ok = err == nil && i >= 0 && i < len(n)
			if ok {
				node = n[i]
			}
		}
		if !ok {
			return nil, false
		}
	}
	return node, true
}

func pointer(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteString("/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(t))
	}
	return b.String()
}
