package envelope

import (
	"bytes"

	"github.com/santhosh-tekuri/jsonschema/v6"
	fastjson "github.com/segmentio/encoding/json"
)

// decodeInstance reads a JSON document to validate as
// jsonschema.UnmarshalJSON reads it (numbers as json.Number, nothing but
// white space after the value), at a fraction of its cost: a run request's
// validation was a quarter of the orchestrator's work on it, half of that
// encoding/json building the document. Input segmentio's decoder refuses is
// read again by jsonschema.UnmarshalJSON, whose error is the one returned;
// FuzzDecodeInstance holds both to the same documents.
func decodeInstance(raw []byte) (any, error) {
	var v any
	if rest, err := fastjson.Parse(raw, &v, fastjson.UseNumber); err == nil && len(rest) == 0 {
		return v, nil
	}
	return jsonschema.UnmarshalJSON(bytes.NewReader(raw))
}
