package identity

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// SeedFile is where Keys keeps a role's nkey seed in a folder:
// <dir>/<role>.nk.
func SeedFile(dir string, r Role) string { return filepath.Join(dir, string(r)+".nk") }

// ErrSeedFile is wrapped when a seed file cannot be used: not a user seed,
// or readable by others than its owner.
var ErrSeedFile = errors.New("unusable nkey seed file")

// Keys are the nkey users of every role: what a server checks and what each
// client signs with.
type Keys struct {
	Dir     string
	public  map[Role]string
	tenants map[Tenant]string    // producers limited to one tenant (tenant.go)
	workers map[string]workerKey // worker identities by queues (workers.go)
}

// LoadOrCreate reads every role's seed from dir, creating the folder (mode
// 0700, when it is new) and any missing seed (a new user nkey, mode 0600). A seed that other
// users may read, or that is not a user seed, is refused: the files are
// credentials.
func LoadOrCreate(dir string) (*Keys, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("identities: %w", err)
	}
	k := &Keys{Dir: dir, public: map[Role]string{}, tenants: map[Tenant]string{}, workers: map[string]workerKey{}}
	for _, r := range Roles() {
		path := SeedFile(dir, r)
		pub, err := PublicKey(path)
		if errors.Is(err, fs.ErrNotExist) {
			pub, err = create(path)
		}
		if err != nil {
			return nil, err
		}
		k.public[r] = pub
	}
	if err := k.loadTenants(); err != nil {
		return nil, err
	}
	if err := k.loadWorkers(); err != nil {
		return nil, err
	}
	return k, nil
}

func private(path string, mask fs.FileMode) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("identities: %w", err)
	}
	if fi.Mode().Perm()&mask != 0 {
		return fmt.Errorf("%w: %s has mode %04o, readable by others: chmod %04o %s",
			ErrSeedFile, path, fi.Mode().Perm(), fi.Mode().Perm()&^mask, path)
	}
	return nil
}

func create(path string) (string, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return "", fmt.Errorf("identities: new nkey: %w", err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return "", fmt.Errorf("identities: new nkey: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("identities: %w", err)
	}
	_, err = f.Write(append(seed, '\n'))
	if err = errors.Join(err, f.Close()); err != nil {
		return "", fmt.Errorf("identities: write %s: %w", path, err)
	}
	return kp.PublicKey()
}

// PublicKey reads a seed file and returns its user's public key. The file
// must hold a user seed (SU...) and be readable by its owner only.
func PublicKey(path string) (string, error) {
	if err := private(path, 0o077); err != nil {
		return "", err
	}
	b, err := os.ReadFile(path) //nolint:gosec // the operator names the file
	if err != nil {
		return "", fmt.Errorf("identities: %w", err)
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
	if err != nil {
		return "", fmt.Errorf("%w: %s: %w", ErrSeedFile, path, err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return "", fmt.Errorf("%w: %s: %w", ErrSeedFile, path, err)
	}
	if !nkeys.IsValidPublicUserKey(pub) {
		return "", fmt.Errorf("%w: %s holds no user seed (want one starting SU)", ErrSeedFile, path)
	}
	return pub, nil
}

// Public is the role's public key.
func (k *Keys) Public(r Role) string { return k.public[r] }

// SeedFile is where the role's seed is.
func (k *Keys) SeedFile(r Role) string { return SeedFile(k.Dir, r) }

// User is one nkey user of the server: a role's, or a tenant producer's.
type User struct {
	// Doc says whose it is, for a configuration file's comment.
	Doc string
	// PublicKey is the nkey the server lets in; Permissions are its
	// subjects, in its account (Accounts).
	PublicKey   string
	Permissions Permissions
}

// user is one nkey user of the server; role is "" for a tenant producer.
type user struct {
	role        Role
	doc, public string
	perms       Permissions
}

// users are the roles' users.
func (k *Keys) users() []user {
	var out []user
	for _, r := range Roles() {
		out = append(out, user{role: r, doc: string(r) + ": " + r.Doc(), public: k.public[r], perms: r.Permissions()})
	}
	return out
}

// ConnectOptions sign a connection in as the role with the seed in
// seedFile, its replies under the role's inbox prefix.
func ConnectOptions(r Role, seedFile string) ([]nats.Option, error) {
	return signIn(seedFile, r.InboxPrefix())
}

// signIn signs a connection in with the user seed in seedFile (checked as
// PublicKey checks it), its replies under inbox.
func signIn(seedFile, inbox string) ([]nats.Option, error) {
	if _, err := PublicKey(seedFile); err != nil {
		return nil, err
	}
	o, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrSeedFile, seedFile, err)
	}
	return []nats.Option{o, nats.CustomInboxPrefix(inbox)}, nil
}

// quoted is a list of subjects, one a line past the first few.
func quoted(subjects []string, indent string) string {
	q := make([]string, len(subjects))
	for i, s := range subjects {
		q[i] = fmt.Sprintf("%q", s)
	}
	if len(q) <= 2 {
		return "[" + strings.Join(q, ", ") + "]"
	}
	return "[\n" + indent + strings.Join(q, ",\n"+indent) + "\n" + indent[:len(indent)-2] + "]"
}
