package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/toolwire/toolwire/services/policy/pii"
)

// Limits of an arguments summary.
const (
	summaryMaxString = 80   // runes of one string value
	summaryMaxItems  = 10   // items of one array
	summaryMaxKeys   = 20   // keys of one object
	summaryMaxDepth  = 4    // nesting shown
	summaryMaxLen    = 2000 // bytes of the whole summary
	redacted         = "[redacted]"
)

// secretKeyRE matches object keys whose values are secrets by their name.
var secretKeyRE = regexp.MustCompile(`(?i)(passw(or)?d|pwd|passcode|secret|token|api[_-]?key|access[_-]?key|private[_-]?key|` +
	`client[_-]?key|authori[sz]ation|(^|[^a-z])auth($|[^a-z])|credential|cookie|session|signature|bearer|otp$|pin$|` +
	`(^|[^a-z])(pin|otp|cvv|cvc|ssn)($|[^a-z]))`)

// secretNumberKeyRE matches the secret-looking keys whose numbers are
// secrets too (a PIN, a card's security code); a number under another
// (max_tokens) is a setting, and shown.
var secretNumberKeyRE = regexp.MustCompile(`(?i)(passw(or)?d|pwd|passcode|(^|[^a-z])(pin|otp|cvv|cvc|ssn)($|[^a-z])|pin$|otp$)`)

// secretValueRE matches string values that look like credentials whatever
// their key: bearer and basic credentials, well-known API key prefixes, AWS
// access key ids, JSON Web Tokens, PEM private keys.
var secretValueRE = regexp.MustCompile(`(?i)^(bearer|basic)\s+\S+|` +
	`^(sk|pk|rk)[-_][A-Za-z0-9_-]{12,}|^gh[pousr]_[A-Za-z0-9]{20,}|^xox[abprs]-|^AKIA[0-9A-Z]{16}$|` +
	`^eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.|-----BEGIN [A-Z ]*PRIVATE KEY-----`)

// SummarizeArgs is SummarizeArgsWith every kind of personal data stripped.
func SummarizeArgs(input json.RawMessage) string { return SummarizeArgsWith(input, pii.New()) }

// SummarizeArgsWith renders a tool call's arguments for an operator who must
// approve the call: compact JSON in which values under secret-looking keys
// and values that look like credentials are replaced by "[redacted]", the
// personal data sc finds in a value is replaced by its kind ("[email]",
// "[card]": before anything is cut, so that no part of one is left), long
// strings, arrays and objects are cut (saying how much was left out), deep
// nesting is elided, and the whole is at most 2000 bytes.
func SummarizeArgsWith(input json.RawMessage, sc *pii.Scanner) string {
	dec := json.NewDecoder(bytes.NewReader(input))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || dec.More() {
		return fmt.Sprintf("(the arguments are not valid JSON: %d bytes)", len(input))
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(summarize(v, 0, sc)); err != nil {
		return fmt.Sprintf("(the arguments cannot be shown: %d bytes)", len(input))
	}
	out := strings.TrimSuffix(b.String(), "\n")
	if len(out) > summaryMaxLen {
		cut := summaryMaxLen
		for cut > 0 && !utf8.RuneStart(out[cut]) {
			cut--
		}
		out = out[:cut] + fmt.Sprintf("…(+%d bytes)", len(out)-cut)
	}
	return out
}

// orderedObject marshals its keys in the given order.
type orderedObject struct {
	keys []string
	vals []any
}

func (o orderedObject) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range o.keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, err := marshalNoEscape(k)
		if err != nil {
			return nil, err
		}
		b.Write(kb)
		b.WriteByte(':')
		vb, err := marshalNoEscape(o.vals[i])
		if err != nil {
			return nil, err
		}
		b.Write(vb)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func marshalNoEscape(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

func summarize(v any, depth int, sc *pii.Scanner) any {
	switch t := v.(type) {
	case json.Number:
		// A card or phone number may be a JSON number.
		if s := t.String(); len(sc.Find(s)) > 0 {
			return sc.Redact(s)
		}
		return t
	case string:
		if secretValueRE.MatchString(t) {
			return redacted
		}
		t = sc.Redact(t)
		if n := utf8.RuneCountInString(t); n > summaryMaxString {
			r := []rune(t)
			return string(r[:summaryMaxString]) + fmt.Sprintf("…(+%d chars)", n-summaryMaxString)
		}
		return t
	case []any:
		if depth >= summaryMaxDepth {
			return fmt.Sprintf("[…%d items]", len(t))
		}
		n := min(len(t), summaryMaxItems)
		out := make([]any, 0, n+1)
		for _, e := range t[:n] {
			out = append(out, summarize(e, depth+1, sc))
		}
		if len(t) > n {
			out = append(out, fmt.Sprintf("…(+%d more)", len(t)-n))
		}
		return out
	case map[string]any:
		if depth >= summaryMaxDepth {
			return fmt.Sprintf("{…%d keys}", len(t))
		}
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		o := orderedObject{}
		for i, k := range keys {
			if i == summaryMaxKeys {
				o.keys = append(o.keys, "…")
				o.vals = append(o.vals, fmt.Sprintf("(+%d more keys)", len(keys)-i))
				break
			}
			shown := k
			if utf8.RuneCountInString(k) > summaryMaxString {
				shown = string([]rune(k)[:summaryMaxString]) + "…"
			}
			o.keys = append(o.keys, shown)
			if secretKeyRE.MatchString(k) && (!isScalarNonString(t[k]) || secretNumberKeyRE.MatchString(k) && t[k] != nil) {
				// Numbers and booleans under such keys (max_tokens) are
				// kept, but for a PIN's and the like.
				o.vals = append(o.vals, redacted)
				continue
			}
			o.vals = append(o.vals, summarize(t[k], depth+1, sc))
		}
		return o
	}
	return v // numbers, booleans, null
}

func isScalarNonString(v any) bool {
	switch v.(type) {
	case json.Number, bool, nil:
		return true
	}
	return false
}
