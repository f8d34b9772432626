package executor

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/secrets"
)

// Secrets (docs/policy.md, Secrets). A tool sees exactly the secrets its
// definition declares in required_secrets, no other: before a call runs, the
// executor resolves each for the call's tenant, narrowest scope first (user,
// then workspace, then org; package secrets), into toolapi.Context.Auth. A secret
// found in no scope fails the call with AUTH_REQUIRED before the tool runs.
// The scope each came from, never the value, is in the call's started event
// (secret_scopes), with a warning when it was the broad org scope.
//
// Values never leave the tool: the tool's output (with any response headers
// it echoes) and error (message and details) are scrubbed of every resolved
// value, in its common encodings too (secrets.Scrubber), before anything else
// sees them (validation, truncation blobs, the cache, writes outcomes, the
// envelope, spans), and the call's logger, which the tool gets as
// toolapi.Context.Log, scrubs every record. A tool that logs through a logger
// of its own is not covered.

// secretResolver opens the secrets bucket on first use, with the keyring of
// Config.Keyring (nil: no master key, and a tool that needs a secret fails
// with AUTH_REQUIRED).
type secretResolver struct {
	js   jetstream.JetStream
	keys *secrets.Keyring

	mu    sync.Mutex
	store *secrets.Store
	// scrubbers are the scrubbers built for sets of resolved values, by a
	// digest of the set: a scrubber takes far longer to build (every
	// encoded form of every value) than to use, and the same secrets come
	// back call after call. A Scrubber is read-only once built.
	scrubbers map[[sha256.Size]byte]*secrets.Scrubber
}

// maxScrubbers bounds the scrubbers kept; past it the cache starts again.
const maxScrubbers = 256

// scrubber returns the scrubber of values, built once per set of values.
func (r *secretResolver) scrubber(values map[string]string) *secrets.Scrubber {
	names := make([]string, 0, len(values))
	for n := range values {
		names = append(names, n)
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		// Length-prefixed, so that no two sets share a digest input.
		fmt.Fprintf(h, "%d:%s%d:%s", len(n), n, len(values[n]), values[n])
	}
	var key [sha256.Size]byte
	h.Sum(key[:0])
	r.mu.Lock()
	defer r.mu.Unlock()
	if sc, ok := r.scrubbers[key]; ok {
		return sc
	}
	if r.scrubbers == nil || len(r.scrubbers) >= maxScrubbers {
		r.scrubbers = map[[sha256.Size]byte]*secrets.Scrubber{}
	}
	sc := secrets.NewScrubber(values)
	r.scrubbers[key] = sc
	return sc
}

func (r *secretResolver) open(ctx context.Context) (*secrets.Store, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.store != nil {
		return r.store, nil
	}
	s, err := secrets.Open(ctx, r.js, r.keys)
	if err != nil {
		return nil, err
	}
	r.store = s
	return s, nil
}

// callSecrets is what the executor resolved for one call.
type callSecrets struct {
	auth map[string]string
	// scopes names, for each secret, the level it came from.
	scopes   map[string]string
	warnings []string
	// err is AUTH_REQUIRED when a secret is missing or cannot be opened.
	err   *envelope.ToolError
	scrub *secrets.Scrubber
}

type callSecretsKey struct{}

// withCallSecrets carries a call's secrets to the stages of its pipeline.
func withCallSecrets(ctx context.Context, cs *callSecrets) context.Context {
	return context.WithValue(ctx, callSecretsKey{}, cs)
}

// secretsOf returns the call's secrets; a call without any has none.
func secretsOf(ctx context.Context) *callSecrets {
	if cs, ok := ctx.Value(callSecretsKey{}).(*callSecrets); ok && cs != nil {
		return cs
	}
	return &callSecrets{}
}

// resolveSecrets resolves the secrets the called tool declares. An error is
// an infrastructure failure (the call is redelivered); a missing secret is
// the result's err.
func (s *Service) resolveSecrets(ctx context.Context, req *events.CallRequest, def *envelope.ToolDefinition, log *slog.Logger) (*callSecrets, error) {
	cs := &callSecrets{}
	if def == nil || len(def.RequiredSecrets) == 0 {
		return cs, nil
	}
	ref := def.Ref()
	if s.secrets == nil || s.secrets.keys == nil {
		cs.err = envelope.NewToolError(envelope.CodeAuthRequired,
			"tool %s needs secrets (%s), and this executor holds no master key to open them",
			ref, strings.Join(def.RequiredSecrets, ", "))
		return cs, nil
	}
	store, err := s.secrets.open(ctx)
	if err != nil {
		return nil, fmt.Errorf("secrets of %s: %w", ref, err)
	}
	cs.auth, cs.scopes = map[string]string{}, map[string]string{}
	var missing, broken []string
	for _, name := range def.RequiredSecrets {
		r, err := store.Resolve(ctx, req.Tenant, name)
		switch {
		case errors.Is(err, secrets.ErrNotFound):
			missing = append(missing, name)
		case errors.Is(err, secrets.ErrUnknownKey) || errors.Is(err, secrets.ErrTampered) || errors.Is(err, secrets.ErrInvalid):
			log.Error("secret cannot be opened", "secret", name, "err", err)
			broken = append(broken, name)
		case err != nil:
			return nil, fmt.Errorf("secrets of %s: %w", ref, err)
		default:
			cs.auth[name] = string(r.Value)
			cs.scopes[name] = string(r.Scope.Level)
			if r.Scope.Level == secrets.LevelOrg {
				cs.warnings = append(cs.warnings, fmt.Sprintf(
					"secret %s of tool %s falls back to the org scope (%s): no user or workspace key is set", name, ref, r.Scope))
			}
		}
	}
	cs.scrub = s.secrets.scrubber(cs.auth)
	switch {
	case len(missing) > 0:
		cs.err = envelope.NewToolError(envelope.CodeAuthRequired,
			"tool %s needs %s %s, set for none of this tenant's scopes (user, workspace, org): set it with `toolwire secrets set`",
			ref, plural(len(missing), "secret", "secrets"), strings.Join(missing, ", ")).
			WithDetails(map[string]any{"missing": missing})
	case len(broken) > 0:
		cs.err = envelope.NewToolError(envelope.CodeAuthRequired,
			"tool %s: %s %s cannot be opened with this executor's master keys: set it again",
			ref, plural(len(broken), "secret", "secrets"), strings.Join(broken, ", ")).
			WithDetails(map[string]any{"unreadable": broken})
	}
	if cs.err != nil {
		// The tool will not run: it gets nothing.
		cs.auth = nil
	}
	return cs, nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// authMap is the tool's toolapi.Context.Auth: a copy, so that a tool cannot
// change what the scrubber knows.
func (cs *callSecrets) authMap() map[string]string {
	out := make(map[string]string, len(cs.auth))
	for k, v := range cs.auth {
		out[k] = v
	}
	return out
}

// logger returns log scrubbed of the call's secret values.
func (cs *callSecrets) logger(log *slog.Logger) *slog.Logger { return cs.scrub.Logger(log) }

// scrubResult removes the call's secret values from a tool's output and
// error.
func (cs *callSecrets) scrubResult(out json.RawMessage, te *envelope.ToolError) (json.RawMessage, *envelope.ToolError) {
	if cs.scrub.Empty() {
		return out, te
	}
	if len(out) > 0 {
		if json.Valid(out) {
			out = cs.scrub.JSON(out)
		} else {
			out = json.RawMessage(cs.scrub.String(string(out)))
		}
	}
	if te != nil {
		clean := *te
		clean.Message = cs.scrub.String(te.Message)
		if te.Details != nil {
			clean.Details = cs.scrub.Any(te.Details)
		}
		te = &clean
	}
	return out, te
}

// scrubEnvelope removes the call's secret values from an envelope (its
// output, error and input), the last guard before it is published.
func (cs *callSecrets) scrubEnvelope(env envelope.ToolEnvelope) envelope.ToolEnvelope {
	if cs.scrub.Empty() {
		return env
	}
	env.Output, env.Error = cs.scrubResult(env.Output, env.Error)
	if len(env.Input) > 0 && cs.scrub.Contains(string(env.Input)) {
		env.Input = cs.scrub.JSON(env.Input)
	}
	return env
}
