package events

import "fmt"

// checkJSONStrings refuses a JSON text whose strings a decoder would change
// without a word: an escaped UTF-16 surrogate that is not half of a pair
// ("\ud800", "\udc00x") becomes U+FFFD in Go, so two different texts would
// decode to one value. (Raw bytes that are not UTF-8 are refused by the
// caller's utf8.Valid.) Text outside strings is left to the JSON decoder.
func checkJSONStrings(b []byte) error {
	in := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !in {
			if c == '"' {
				in = true
			}
			continue
		}
		switch c {
		case '"':
			in = false
		case '\\':
			if i+1 >= len(b) {
				return nil // truncated: the decoder says so
			}
			i++
			if b[i] != 'u' {
				continue
			}
			r, ok := hex4(b, i+1)
			if !ok {
				continue
			}
			i += 4
			switch {
			case r >= 0xDC00 && r <= 0xDFFF:
				return fmt.Errorf("a string holds the lone low surrogate \\u%04x", r)
			case r >= 0xD800 && r <= 0xDBFF:
				low, ok := -1, i+2 < len(b) && b[i+1] == '\\' && b[i+2] == 'u'
				if ok {
					if v, hexOK := hex4(b, i+3); hexOK {
						low = v
					}
				}
				if low < 0xDC00 || low > 0xDFFF {
					return fmt.Errorf("a string holds the lone high surrogate \\u%04x", r)
				}
				i += 6
			}
		}
	}
	return nil
}

// hex4 reads four hex digits at b[i:].
func hex4(b []byte, i int) (int, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	v := 0
	for _, c := range b[i : i+4] {
		d, ok := unhex(c)
		if !ok {
			return 0, false
		}
		v = v<<4 | int(d)
	}
	return v, true
}
