package identity

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/toolwire/toolwire/pkg/events"
)

// Tenant is an upstream producer limited to one tenant: an org, or one
// workspace of it. It may hand in run requests on its tenant's intake
// subjects (events.IntakeSubject) and nothing else: no other tenant's
// requests, no event of any run, no stream to read. It follows its runs
// through the recorder's API with a token of its org, which answers for
// that org's runs only. Its replies come under an inbox prefix of its own
// public key, which no other user may subscribe to.
type Tenant struct {
	Org       string
	Workspace string // "": every workspace of Org
}

// ErrTenant is wrapped when a tenant cannot be a NATS identity.
var ErrTenant = errors.New("unusable tenant identity")

// ParseTenant reads "org" or "org/workspace".
func ParseTenant(s string) (Tenant, error) {
	org, ws, _ := strings.Cut(strings.TrimSpace(s), "/")
	t := Tenant{Org: org, Workspace: ws}
	if err := t.validate(); err != nil {
		return Tenant{}, err
	}
	return t, nil
}

func (t Tenant) validate() error {
	if _, _, err := events.IntakeTokens(t.Org, t.Workspace); err != nil {
		return fmt.Errorf("%w: %w", ErrTenant, err)
	}
	return nil
}

// String is "org" or "org/workspace", as ParseTenant reads it.
func (t Tenant) String() string {
	if t.Workspace == "" {
		return t.Org
	}
	return t.Org + "/" + t.Workspace
}

// tenantPrefix starts the name of every tenant's seed file.
const tenantPrefix = "tenant."

// TenantSeedFile is where Keys keeps a tenant producer's nkey seed in a
// folder: <dir>/tenant.<org>.nk, or <dir>/tenant.<org>.<workspace>.nk.
func TenantSeedFile(dir string, t Tenant) string {
	name := tenantPrefix + t.Org
	if t.Workspace != "" {
		name += "." + t.Workspace
	}
	return filepath.Join(dir, name+".nk")
}

// tenantOfFile is the tenant whose seed file is name; false when name is
// not a tenant's seed file.
func tenantOfFile(name string) (Tenant, bool, error) {
	if !strings.HasPrefix(name, tenantPrefix) || !strings.HasSuffix(name, ".nk") {
		return Tenant{}, false, nil
	}
	parts := strings.Split(strings.TrimSuffix(strings.TrimPrefix(name, tenantPrefix), ".nk"), ".")
	t := Tenant{Org: parts[0]}
	if len(parts) == 2 {
		t.Workspace = parts[1]
	}
	if len(parts) > 2 {
		return Tenant{}, false, fmt.Errorf("%w: seed file %s: want tenant.<org>.nk or tenant.<org>.<workspace>.nk", ErrTenant, name)
	}
	if err := t.validate(); err != nil {
		return Tenant{}, false, fmt.Errorf("seed file %s: %w", name, err)
	}
	return t, true, nil
}

// TenantInboxPrefix is the prefix of the reply subjects of the tenant
// producer whose public key is public.
func TenantInboxPrefix(public string) string { return "_INBOX_" + public }

// Permissions are what the tenant producer whose public key is public may
// do: publish on its tenant's intake subjects, receive its replies.
func (t Tenant) Permissions(public string) (Permissions, error) {
	filter, err := events.IntakeFilter(t.Org, t.Workspace)
	if err != nil {
		return Permissions{}, fmt.Errorf("%w: %w", ErrTenant, err)
	}
	// $JS.API.INFO is answered in its own account, which has no JetStream:
	// how a client learns it is outside the system account
	// (direct.JetStream).
	return Permissions{Publish: []string{filter, "$JS.API.INFO"}, Subscribe: []string{TenantInboxPrefix(public) + ".>"}}, nil
}

// Doc says what the tenant producer is, for the server config.
func (t Tenant) Doc() string {
	return "an upstream system limited to tenant " + t.String() + ": hands in its run requests on the intake, nothing else"
}

// TenantConnectOptions sign a connection in as the tenant producer with the
// seed in seedFile, its replies under its own inbox prefix.
func TenantConnectOptions(seedFile string) ([]nats.Option, error) {
	pub, err := PublicKey(seedFile)
	if err != nil {
		return nil, err
	}
	return signIn(seedFile, TenantInboxPrefix(pub))
}

// loadTenants reads the tenant producers' seeds in k.Dir.
func (k *Keys) loadTenants() error {
	entries, err := os.ReadDir(k.Dir)
	if err != nil {
		return fmt.Errorf("identities: %w", err)
	}
	for _, e := range entries {
		t, ok, err := tenantOfFile(e.Name())
		if err != nil {
			return fmt.Errorf("identities: %w", err)
		}
		if !ok {
			continue
		}
		pub, err := PublicKey(filepath.Join(k.Dir, e.Name()))
		if err != nil {
			return err
		}
		k.tenants[t] = pub
	}
	return nil
}

// AddTenant makes the seed of a producer limited to t, unless it has one.
func (k *Keys) AddTenant(t Tenant) error {
	if err := t.validate(); err != nil {
		return err
	}
	path := TenantSeedFile(k.Dir, t)
	pub, err := PublicKey(path)
	if errors.Is(err, fs.ErrNotExist) {
		pub, err = create(path)
	}
	if err != nil {
		return err
	}
	k.tenants[t] = pub
	return nil
}

// Tenants are the tenant producers with a seed in the folder, in order.
func (k *Keys) Tenants() []Tenant {
	out := make([]Tenant, 0, len(k.tenants))
	for t := range k.tenants {
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b Tenant) int { return strings.Compare(a.String(), b.String()) })
	return out
}

// TenantPublic is the tenant producer's public key ("" when it has none).
func (k *Keys) TenantPublic(t Tenant) string { return k.tenants[t] }

// TenantSeedFile is where the tenant producer's seed is.
func (k *Keys) TenantSeedFile(t Tenant) string { return TenantSeedFile(k.Dir, t) }
