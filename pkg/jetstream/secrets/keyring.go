package secrets

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Environment variables of the master keys. Only the executor and the CLI read
// them: no other service can open a secret.
const (
	// EnvMasterKeys holds the master keys, "id1:base64key,id2:base64key";
	// each key is 32 random bytes (AES-256), in standard base64.
	EnvMasterKeys = "TOOLWIRE_MASTER_KEYS"
	// EnvMasterKeyID names the key that seals new writes; it may be omitted
	// when there is one key.
	EnvMasterKeyID = "TOOLWIRE_MASTER_KEY_ID"
)

// KeySize is the size of a master key: AES-256.
const KeySize = 32

// Errors of the keyring.
var (
	// ErrNoKeyring is returned when a secret must be sealed or opened and no
	// master key is configured.
	ErrNoKeyring = errors.New("no master key: set " + EnvMasterKeys)
	// ErrUnknownKey is returned when a secret was sealed under a key id the
	// keyring does not hold (a key retired too early).
	ErrUnknownKey = errors.New("secret sealed under a master key that is not configured")
	// ErrTampered is returned when a sealed value does not open: it was
	// altered, or moved to another scope or name.
	ErrTampered = errors.New("sealed secret does not authenticate")
)

var keyIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)

// Keyring holds the master keys by id and the id that seals new writes. Old
// keys stay in the ring to open what they sealed until `toolwire secrets
// rotate` has resealed everything under the current key.
type Keyring struct {
	aeads   map[string]cipher.AEAD
	current string
}

// NewKeyring returns a keyring of the given keys (id to 32-byte key) whose
// current key is current.
func NewKeyring(current string, keys map[string][]byte) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, errors.New("keyring: no keys")
	}
	k := &Keyring{aeads: make(map[string]cipher.AEAD, len(keys)), current: current}
	for id, key := range keys {
		if !keyIDRE.MatchString(id) {
			return nil, fmt.Errorf("keyring: key id %q must be 1-32 letters, digits, '-' or '_'", id)
		}
		if len(key) != KeySize {
			return nil, fmt.Errorf("keyring: key %q is %d bytes; want %d (AES-256)", id, len(key), KeySize)
		}
		block, err := aes.NewCipher(key)
		if err != nil {
			return nil, fmt.Errorf("keyring: key %q: %w", id, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("keyring: key %q: %w", id, err)
		}
		k.aeads[id] = aead
	}
	if current == "" && len(keys) == 1 {
		for id := range keys {
			k.current = id
		}
	}
	if k.current == "" {
		return nil, fmt.Errorf("keyring: %d keys and no current one: set %s", len(keys), EnvMasterKeyID)
	}
	if _, ok := k.aeads[k.current]; !ok {
		return nil, fmt.Errorf("keyring: current key %q is not among the keys (%s)", k.current, strings.Join(k.IDs(), ", "))
	}
	return k, nil
}

// ParseKeyring parses "id1:base64key,id2:base64key" with current naming the
// sealing key ("" when there is one key).
func ParseKeyring(keys, current string) (*Keyring, error) {
	m := map[string][]byte{}
	for i, part := range strings.Split(keys, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		id, b64, ok := strings.Cut(part, ":")
		if !ok {
			return nil, fmt.Errorf("%s: entry %d is not id:base64key", EnvMasterKeys, i+1)
		}
		id = strings.TrimSpace(id)
		key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64))
		if err != nil {
			return nil, fmt.Errorf("%s: key %q is not standard base64", EnvMasterKeys, id)
		}
		if _, dup := m[id]; dup {
			return nil, fmt.Errorf("%s: key id %q is given twice", EnvMasterKeys, id)
		}
		m[id] = key
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("%s holds no key", EnvMasterKeys)
	}
	k, err := NewKeyring(strings.TrimSpace(current), m)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvMasterKeys, err)
	}
	return k, nil
}

// KeyringFromEnv reads the keyring from EnvMasterKeys and EnvMasterKeyID. It
// returns nil and no error when no key is configured.
func KeyringFromEnv(getenv func(string) string) (*Keyring, error) {
	if getenv == nil {
		return nil, nil
	}
	keys := getenv(EnvMasterKeys)
	if strings.TrimSpace(keys) == "" {
		return nil, nil
	}
	return ParseKeyring(keys, getenv(EnvMasterKeyID))
}

// GenerateKey returns a new random master key, in the form EnvMasterKeys
// takes: "id:base64key".
func GenerateKey(id string) (string, error) {
	if !keyIDRE.MatchString(id) {
		return "", fmt.Errorf("key id %q must be 1-32 letters, digits, '-' or '_'", id)
	}
	key := make([]byte, KeySize)
	if _, err := rand.Read(key); err != nil {
		return "", fmt.Errorf("generate key: %w", err)
	}
	return id + ":" + base64.StdEncoding.EncodeToString(key), nil
}

// CurrentID is the id of the key that seals new writes.
func (k *Keyring) CurrentID() string { return k.current }

// IDs lists the key ids, sorted.
func (k *Keyring) IDs() []string {
	ids := make([]string, 0, len(k.aeads))
	for id := range k.aeads {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// seal encrypts plaintext under the current key, authenticating aad.
func (k *Keyring) seal(plaintext, aad []byte) (keyID string, nonce, ciphertext []byte, err error) {
	aead := k.aeads[k.current]
	nonce = make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", nil, nil, fmt.Errorf("seal: nonce: %w", err)
	}
	return k.current, nonce, aead.Seal(nil, nonce, plaintext, aad), nil
}

// open decrypts a value sealed under keyID with aad.
func (k *Keyring) open(keyID string, nonce, ciphertext, aad []byte) ([]byte, error) {
	aead, ok := k.aeads[keyID]
	if !ok {
		return nil, fmt.Errorf("%w: key id %q", ErrUnknownKey, keyID)
	}
	if len(nonce) != aead.NonceSize() {
		return nil, fmt.Errorf("%w: nonce of %d bytes", ErrTampered, len(nonce))
	}
	pt, err := aead.Open(nil, nonce, ciphertext, aad)
	if err != nil {
		return nil, ErrTampered
	}
	return pt, nil
}
