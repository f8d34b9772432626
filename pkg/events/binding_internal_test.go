package events

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// attributeHeadersByMaps is attributeHeaders as it was written first, with
// maps: the oracle of FuzzAttributeHeaders.
func attributeHeadersByMaps(h nats.Header) (map[string]string, error) {
	attrs := make(map[string]string, len(h))
	spelled := make(map[string]string, len(h))
	var dups []string
	for k, vs := range h {
		lk := strings.ToLower(k)
		if !strings.HasPrefix(lk, HeaderPrefix) && lk != HeaderContentType {
			continue
		}
		if len(vs) > 1 {
			dups = append(dups, fmt.Sprintf("%s is sent %d times", k, len(vs)))
		}
		if prev, dup := spelled[lk]; dup {
			a, b := min(prev, k), max(prev, k)
			dups = append(dups, fmt.Sprintf("%s and %s name one attribute", a, b))
		}
		spelled[lk] = k
		if len(vs) > 0 {
			attrs[lk] = vs[0]
		}
	}
	if _, ok := spelled[HeaderContentType]; ok {
		if k, both := spelled[HeaderPrefix+"datacontenttype"]; both {
			dups = append(dups, fmt.Sprintf("%s and %s both set datacontenttype", spelled[HeaderContentType], k))
		}
	}
	if len(dups) > 0 {
		sort.Strings(dups)
		return nil, fmt.Errorf("an attribute appears more than once: %s", strings.Join(dups, "; "))
	}
	return attrs, nil
}

// FuzzAttributeHeaders: the slice-based attributeHeaders takes the headers
// the map-based one took, with the same attributes, and refuses the rest with
// the same reason (when no attribute has three spellings or more: the maps
// then named pairs in map order).
func FuzzAttributeHeaders(f *testing.F) {
	f.Add("ce-specversion: 1.0\nce-id: 1\nce-type: t\nce-source: /s\ncontent-type: application/json\nNats-Msg-Id: 1\ntraceparent: x\n")
	f.Add("ce-type: t\nCE-TYPE: u\n")
	f.Add("ce-type: t\nce-type: u\n")
	f.Add("Content-Type: a\nce-datacontenttype: b\n")
	f.Add("CE-ID: 1\nCe-Id: 2\nce-id: 3\n")
	f.Add("cE-x: 1\nCONTENT-TYPE: y\nce-\u212a: k\n")
	f.Fuzz(func(t *testing.T, blob string) {
		h := nats.Header{}
		spellings := map[string]int{}
		for line := range strings.SplitSeq(blob, "\n") {
			k, v, ok := strings.Cut(line, ": ")
			if !ok {
				continue
			}
			if _, seen := h[k]; !seen {
				spellings[strings.ToLower(k)]++
			}
			h[k] = append(h[k], v)
		}
		want, wantErr := attributeHeadersByMaps(h)
		got, err := attributeHeaders(h)
		if wantErr != nil {
			require.Error(t, err)
			for _, n := range spellings {
				if n > 2 {
					return
				}
			}
			require.Equal(t, wantErr.Error(), err.Error())
			return
		}
		require.NoError(t, err)
		gotMap := map[string]string{}
		for _, a := range got {
			_, twice := gotMap[a.name]
			require.False(t, twice, "attribute %s given twice", a.name)
			gotMap[a.name] = a.value
		}
		require.Equal(t, want, gotMap)
		for name, v := range want {
			require.Equal(t, v, got.get(name))
		}
	})
}

// BenchmarkAttributeHeaders: an event's headers, read for their attributes.
func BenchmarkAttributeHeaders(b *testing.B) {
	h := nats.Header{}
	for _, k := range []string{"ce-specversion", "ce-id", "ce-source", "ce-type", "ce-subject", "ce-dataschema", "ce-time",
		"ce-runid", "ce-callid", "ce-tenantid", "ce-traceparent", "content-type", "Nats-Msg-Id", "traceparent"} {
		h[k] = []string{"value of " + k}
	}
	b.Run("slice", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := attributeHeaders(h); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("maps", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := attributeHeadersByMaps(h); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestAttributeHeadersOfManyHeaders: a message with many attribute headers
// is read (or refused for a repeat) as a short one is; past
// maxScannedAttributes they are sorted, not compared pair by pair.
func TestAttributeHeadersOfManyHeaders(t *testing.T) {
	h := nats.Header{}
	for i := range 5000 {
		h[fmt.Sprintf("ce-x%d", i)] = []string{"v"}
	}
	got, err := attributeHeaders(h)
	require.NoError(t, err)
	require.Len(t, got, 5000)
	require.Equal(t, "v", got.get("ce-x4999"))

	h["CE-X17"] = []string{"w"}
	_, err = attributeHeaders(h)
	require.ErrorContains(t, err, "CE-X17 and ce-x17 name one attribute")
}

// TestSetDataSchemaAgreesWithTheSDK: the parsed dataschema URLs of the table
// give an event the very attribute the SDK's setter gives it, and any other
// value goes through the setter (its errors recorded as before).
func TestSetDataSchemaAgreesWithTheSDK(t *testing.T) {
	var values []string
	for _, et := range table {
		if et.Schema != "" {
			values = append(values, envelope.SchemaURL(et.Schema))
		}
	}
	require.NotEmpty(t, values)
	require.Len(t, schemaURIs, len(slices.Compact(slices.Sorted(slices.Values(values)))), "every schema URL of the table is parsed once")
	values = append(values, "https://example.com/other.json", " https://example.com/spaced.json ", "", "::not a url")
	for _, v := range values {
		want, got := event.New(), event.New()
		want.SetDataSchema(v)
		setDataSchema(&got, v)
		require.Equal(t, want.Context, got.Context, "dataschema %q", v)
		require.Equal(t, want.FieldErrors, got.FieldErrors, "dataschema %q", v)
	}
}
