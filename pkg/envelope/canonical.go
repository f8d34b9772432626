package envelope

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/gowebpki/jcs"
)

// Canonicalize returns the RFC 8785 (JSON Canonicalization Scheme) form of raw:
// object keys sorted by UTF-16 code units, no insignificant whitespace, numbers
// in their shortest ECMAScript spelling. Two documents that differ only in key
// order, whitespace or number spelling (1.0, 1, 1e0) canonicalize identically.
//
// An empty input is treated as the JSON null. Invalid JSON is an error.
func Canonicalize(raw []byte) ([]byte, error) {
	if len(raw) == 0 {
		return []byte("null"), nil
	}
	if !json.Valid(raw) {
		return nil, fmt.Errorf("canonicalize: %w", ErrInvalidJSON)
	}
	out, err := jcs.Transform(raw)
	if err != nil {
		return nil, fmt.Errorf("canonicalize: %w: %w", ErrInvalidJSON, err)
	}
	return out, nil
}

// CallID is the deterministic id of a tool call (docs/architecture.md, Events:
// Ids): the hex SHA-256 of "name@version", the canonical JSON of the input and
// the call's sequence number in its run, separated by newlines:
//
//	sha256("name@version" "\n" canonical(input) "\n" decimal(seq))
func CallID(name, version string, input []byte, seq int) (string, error) {
	canon, err := Canonicalize(input)
	if err != nil {
		return "", fmt.Errorf("call id: %w", err)
	}
	h := sha256.New()
	h.Write([]byte(name + "@" + version))
	h.Write([]byte{'\n'})
	h.Write(canon)
	h.Write([]byte{'\n'})
	h.Write([]byte(strconv.Itoa(seq)))
	return hex.EncodeToString(h.Sum(nil)), nil
}

// CacheKey is the executor's cache key for a call: the call id's hash without the
// sequence number, scoped by tenant so that one tenant never reads another's
// cache:
//
//	sha256(tenantID "\n" "name@version" "\n" canonical(input))
func CacheKey(tenantID, name, version string, input []byte) (string, error) {
	if tenantID == "" {
		return "", fmt.Errorf("cache key: %w", ErrMissingTenant)
	}
	canon, err := Canonicalize(input)
	if err != nil {
		return "", fmt.Errorf("cache key: %w", err)
	}
	h := sha256.New()
	h.Write([]byte(tenantID))
	h.Write([]byte{'\n'})
	h.Write([]byte(name + "@" + version))
	h.Write([]byte{'\n'})
	h.Write(canon)
	return hex.EncodeToString(h.Sum(nil)), nil
}
