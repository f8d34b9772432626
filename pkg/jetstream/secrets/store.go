// Package secrets keeps scoped secrets (docs/policy.md, Secrets) sealed in the
// JetStream KV bucket events.BucketSecrets.
//
// A secret lives at org, workspace or user scope under a name such as
// OPENAI_API_KEY. Its value is sealed with AES-256-GCM under a master key
// named by id (EnvMasterKeys; new writes use EnvMasterKeyID), with a random
// nonce, and the additional authenticated data is the secret's KV key, which
// encodes its scope and name: a sealed value moved to another scope or name
// does not open. Only the executor and the CLI hold the master keys; the other
// services (the recorder's tool catalog) see which secrets exist, never their
// values: every key is also in events.BucketSecretNames, without a value,
// and that bucket is all such a reader may open (Locate).
//
// The executor resolves a tool's secrets for a tenant narrowest first: user,
// then workspace, then org (Store.Resolve).
package secrets

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
)

// Bounds of a secret's value.
const (
	// MinValueSize is the shortest value accepted: a shorter one could not be
	// scrubbed from outputs without mangling them.
	MinValueSize = 4
	// MaxValueSize is the longest value accepted.
	MaxValueSize = 64 << 10
)

// ErrNotFound is returned for a secret that is not stored.
var ErrNotFound = errors.New("secret not found")

// recordVersion is the format version of a sealed record, bound into its
// additional data.
const recordVersion = 1

// record is a sealed secret as stored in the bucket. It holds no plaintext.
type record struct {
	V          int       `json:"v"`
	KeyID      string    `json:"key_id"`
	Nonce      []byte    `json:"nonce"`
	Ciphertext []byte    `json:"ciphertext"`
	UpdatedAt  time.Time `json:"updated_at"`
}

func decodeRecord(b []byte) (record, error) {
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return record{}, fmt.Errorf("%w: sealed record: %w", ErrTampered, err)
	}
	if r.V != recordVersion {
		return record{}, fmt.Errorf("%w: sealed record version %d", ErrTampered, r.V)
	}
	return r, nil
}

func aad(key string) []byte {
	return []byte(fmt.Sprintf("toolwire-secret/v%d\x00%s", recordVersion, key))
}

// Info describes a stored secret, never its value.
type Info struct {
	Scope     Scope     `json:"scope"`
	Name      string    `json:"name"`
	KeyID     string    `json:"key_id"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Resolved is a secret's value and the scope it came from.
type Resolved struct {
	Value []byte
	Scope Scope
}

// Store reads and writes sealed secrets. A Store without a keyring can list
// and locate secrets but not read or write their values.
type Store struct {
	kv    jetstream.KeyValue // the sealed secrets
	names jetstream.KeyValue // their keys, without values
	keys  *Keyring
	now   func() time.Time
}

// Open opens the secrets bucket and the bucket of their names (both
// provisioned by provision.Provision). keys may be nil for a store that only
// lists and locates.
func Open(ctx context.Context, js jetstream.JetStream, keys *Keyring) (*Store, error) {
	kv, err := js.KeyValue(ctx, provision.BucketSecrets)
	if err != nil {
		return nil, fmt.Errorf("open secrets: %w", err)
	}
	names, err := js.KeyValue(ctx, provision.BucketSecretNames)
	if err != nil {
		return nil, fmt.Errorf("open the names of secrets: %w", err)
	}
	return &Store{kv: kv, names: names, keys: keys, now: time.Now}, nil
}

// nameValue is what a key of the names bucket holds: only that it exists.
var nameValue = []byte("1")

// CanOpen reports whether the store holds master keys.
func (s *Store) CanOpen() bool { return s.keys != nil }

func validateNamed(scope Scope, name string) error {
	if err := scope.Validate(); err != nil {
		return err
	}
	if err := envelope.ValidateSecretName(name); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// Set seals value under the current master key and stores it as the secret
// name of scope, replacing any previous value.
func (s *Store) Set(ctx context.Context, scope Scope, name string, value []byte) error {
	if err := validateNamed(scope, name); err != nil {
		return err
	}
	if len(value) < MinValueSize || len(value) > MaxValueSize {
		return fmt.Errorf("%w: value of %d bytes; want %d to %d", ErrInvalid, len(value), MinValueSize, MaxValueSize)
	}
	if s.keys == nil {
		return ErrNoKeyring
	}
	key := scope.key(name)
	b, err := s.seal(key, value)
	if err != nil {
		return err
	}
	if _, err := s.kv.Put(ctx, key, b); err != nil {
		return fmt.Errorf("store secret %s in %s: %w", name, scope, err)
	}
	if _, err := s.names.Put(ctx, key, nameValue); err != nil {
		return fmt.Errorf("secret %s in %s is stored, but its name is not (run toolwire secrets reindex): %w", name, scope, err)
	}
	return nil
}

func (s *Store) seal(key string, value []byte) ([]byte, error) {
	keyID, nonce, ct, err := s.keys.seal(value, aad(key))
	if err != nil {
		return nil, err
	}
	return json.Marshal(record{V: recordVersion, KeyID: keyID, Nonce: nonce, Ciphertext: ct, UpdatedAt: s.now().UTC()})
}

// Get opens the secret name of scope.
func (s *Store) Get(ctx context.Context, scope Scope, name string) ([]byte, error) {
	if err := validateNamed(scope, name); err != nil {
		return nil, err
	}
	if s.keys == nil {
		return nil, ErrNoKeyring
	}
	v, _, err := s.get(ctx, scope.key(name))
	if err != nil {
		return nil, fmt.Errorf("secret %s in %s: %w", name, scope, err)
	}
	return v, nil
}

// get reads and opens a key; ErrNotFound when it holds nothing.
func (s *Store) get(ctx context.Context, key string) ([]byte, record, error) {
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, record{}, ErrNotFound
	}
	if err != nil {
		return nil, record{}, fmt.Errorf("read: %w", err)
	}
	r, err := decodeRecord(e.Value())
	if err != nil {
		return nil, record{}, err
	}
	v, err := s.keys.open(r.KeyID, r.Nonce, r.Ciphertext, aad(key))
	return v, r, err
}

// Delete removes the secret name of scope, with its history.
func (s *Store) Delete(ctx context.Context, scope Scope, name string) error {
	if err := validateNamed(scope, name); err != nil {
		return err
	}
	key := scope.key(name)
	if _, err := s.kv.Get(ctx, key); errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("secret %s in %s: %w", name, scope, ErrNotFound)
	} else if err != nil {
		return fmt.Errorf("secret %s in %s: %w", name, scope, err)
	}
	// Purge, not Delete: the sealed values of earlier revisions go too.
	if err := s.kv.Purge(ctx, key); err != nil {
		return fmt.Errorf("remove secret %s in %s: %w", name, scope, err)
	}
	if err := s.names.Purge(ctx, key); err != nil {
		return fmt.Errorf("secret %s in %s is removed, but its name is not (run toolwire secrets reindex): %w", name, scope, err)
	}
	return nil
}

// Reindex makes the names bucket hold exactly the keys of the secrets bucket
// (secrets stored before it existed, or a write that failed between the
// two): it adds the names missing and removes those of no secret, and
// returns how many it changed. It reads no value.
func (s *Store) Reindex(ctx context.Context) (int, error) {
	have, err := keysUnder(ctx, s.kv, ">")
	if err != nil {
		return 0, err
	}
	named, err := keysUnder(ctx, s.names, ">")
	if err != nil {
		return 0, err
	}
	changed := 0
	for _, k := range have {
		if _, found := slices.BinarySearch(named, k); !found {
			if _, err := s.names.Put(ctx, k, nameValue); err != nil {
				return changed, fmt.Errorf("reindex secrets: %w", err)
			}
			changed++
		}
	}
	for _, k := range named {
		if _, found := slices.BinarySearch(have, k); !found {
			if err := s.names.Purge(ctx, k); err != nil {
				return changed, fmt.Errorf("reindex secrets: %w", err)
			}
			changed++
		}
	}
	return changed, nil
}

// List describes the secrets of one scope, sorted by name. It needs no master
// key: it never opens a value.
func (s *Store) List(ctx context.Context, scope Scope) ([]Info, error) {
	if err := scope.Validate(); err != nil {
		return nil, err
	}
	keys, err := keysUnder(ctx, s.kv, scope.prefix()+"*")
	if err != nil {
		return nil, err
	}
	out := make([]Info, 0, len(keys))
	for _, k := range keys {
		e, err := s.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("list secrets of %s: %w", scope, err)
		}
		info := Info{Scope: scope, Name: strings.TrimPrefix(k, scope.prefix())}
		if r, err := decodeRecord(e.Value()); err == nil {
			info.KeyID, info.UpdatedAt = r.KeyID, r.UpdatedAt
		}
		out = append(out, info)
	}
	return out, nil
}

// keysUnder lists the keys of kv matching filter, sorted and without
// duplicates; none is no keys.
func keysUnder(ctx context.Context, kv jetstream.KeyValue, filter string) ([]string, error) {
	lister, err := kv.ListKeysFiltered(ctx, filter)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list secrets: %w", err)
	}
	seen := map[string]bool{}
	var keys []string
	for k := range lister.Keys() { // drained to the end: the lister's goroutine then exits
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list secrets: %w", err)
	}
	sort.Strings(keys)
	return keys, nil
}

// Locate tells, for each secret name a tenant can use, the narrowest level
// that holds it, from the names bucket alone (it reads no sealed value):
// what the tool catalog shows as auth status.
func (s *Store) Locate(ctx context.Context, t envelope.Tenant) (map[string]Level, error) {
	out := map[string]Level{}
	scopes := ScopesFor(t)
	// Broadest first, so that narrower levels overwrite.
	for i := len(scopes) - 1; i >= 0; i-- {
		sc := scopes[i]
		if sc.Validate() != nil {
			continue
		}
		keys, err := keysUnder(ctx, s.names, sc.prefix()+"*")
		if err != nil {
			return nil, err
		}
		for _, k := range keys {
			out[strings.TrimPrefix(k, sc.prefix())] = sc.Level
		}
	}
	return out, nil
}

// Resolve opens the secret name for a tenant from the narrowest scope that
// holds it: user, then workspace, then org. It returns ErrNotFound when no
// scope does.
func (s *Store) Resolve(ctx context.Context, t envelope.Tenant, name string) (Resolved, error) {
	if err := envelope.ValidateSecretName(name); err != nil {
		return Resolved{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if s.keys == nil {
		return Resolved{}, ErrNoKeyring
	}
	for _, sc := range ScopesFor(t) {
		if sc.Validate() != nil {
			continue
		}
		v, _, err := s.get(ctx, sc.key(name))
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return Resolved{}, fmt.Errorf("secret %s in %s: %w", name, sc, err)
		}
		return Resolved{Value: v, Scope: sc}, nil
	}
	return Resolved{}, fmt.Errorf("secret %s for tenant %s: %w", name, t.ID(), ErrNotFound)
}

// Reseal re-encrypts every secret not sealed under the current master key, so
// that an old key can be retired. A secret written meanwhile is left as its
// writer sealed it (compare-and-set). It returns how many it resealed.
func (s *Store) Reseal(ctx context.Context) (int, error) {
	if s.keys == nil {
		return 0, ErrNoKeyring
	}
	keys, err := keysUnder(ctx, s.kv, ">")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, k := range keys {
		e, err := s.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return n, fmt.Errorf("reseal %s: %w", k, err)
		}
		r, err := decodeRecord(e.Value())
		if err != nil {
			return n, fmt.Errorf("reseal %s: %w", k, err)
		}
		if r.KeyID == s.keys.CurrentID() {
			continue
		}
		v, err := s.keys.open(r.KeyID, r.Nonce, r.Ciphertext, aad(k))
		if err != nil {
			return n, fmt.Errorf("reseal %s: %w", k, err)
		}
		b, err := s.seal(k, v)
		if err != nil {
			return n, err
		}
		if _, err := s.kv.Update(ctx, k, b, e.Revision()); err != nil {
			if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
				continue // rewritten meanwhile, under the current key
			}
			return n, fmt.Errorf("reseal %s: %w", k, err)
		}
		n++
	}
	return n, nil
}
