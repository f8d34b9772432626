package deploy

import (
	"flag"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/identity"
)

// TestComposeClusterOption: docker-compose.cluster.yml over docker-compose.yml
// makes three NATS servers one JetStream cluster (their command lines read by
// nats-server's own flag parser), and points every toolwire service at all of
// them with streams on as many replicas.
func TestComposeClusterOption(t *testing.T) {
	base := readCompose(t, filepath.Join(repoRoot, "docker-compose.yml"))
	over := readCompose(t, filepath.Join(repoRoot, "docker-compose.cluster.yml"))
	merged := mergeCompose(base, over)
	ids := runIdentities(t, merged)

	var servers []string
	for name, svc := range merged.Services {
		if strings.HasPrefix(svc.Image, "nats:") {
			servers = append(servers, name)
		}
	}
	slices.Sort(servers)
	require.Len(t, servers, 3, "the cluster option runs three NATS servers")

	names, clusters := map[string]bool{}, map[string]bool{}
	volumes := map[string]string{}
	for _, name := range servers {
		svc := merged.Services[name]
		opts := natsServerOptions(t, name, svc, ids)
		require.True(t, opts.JetStream, "%s runs JetStream", name)
		require.NotEmpty(t, opts.StoreDir, name)
		require.NotEmpty(t, opts.ServerName, "%s: JetStream in a cluster needs a server name", name)
		require.False(t, names[opts.ServerName], "%s: server name %s is taken", name, opts.ServerName)
		names[opts.ServerName] = true
		require.NotEmpty(t, opts.Cluster.Name, name)
		clusters[opts.Cluster.Name] = true
		require.NotZero(t, opts.Cluster.Port, "%s listens for routes", name)
		var routed []string
		for _, r := range opts.Routes {
			require.Equal(t, strconv.Itoa(opts.Cluster.Port), r.Port(), "%s routes to the cluster port", name)
			routed = append(routed, r.Hostname())
		}
		slices.Sort(routed)
		require.Equal(t, servers, routed, "%s knows a route to every server", name)

		vol := volumeAt(svc.Volumes, opts.StoreDir)
		require.NotEmpty(t, vol, "%s keeps its store %s on a volume", name, opts.StoreDir)
		require.NotContains(t, volumes, vol, "%s and %s share the volume %s", name, volumes[vol], vol)
		volumes[vol] = name
	}
	require.Len(t, clusters, 1, "one cluster name")

	for name, svc := range merged.Services {
		if _, ok := identity.ForService(svc.Build.Target); !ok {
			continue
		}
		natsURL := fmt.Sprint(svc.Environment["NATS_URL"])
		var hosts []string
		for _, u := range strings.Split(natsURL, ",") {
			p, err := url.Parse(strings.TrimSpace(u))
			require.NoError(t, err, "%s NATS_URL %q", name, natsURL)
			hosts = append(hosts, p.Hostname())
		}
		slices.Sort(hosts)
		require.Equal(t, servers, hosts, "%s connects to every server, so that it outlives one", name)
		require.Equal(t, strconv.Itoa(len(servers)), fmt.Sprint(svc.Environment["TOOLWIRE_STREAM_REPLICAS"]),
			"%s asks for one stream replica per server", name)
		for _, s := range servers {
			require.Contains(t, svc.DependsOn, s, "%s starts after %s", name, s)
		}
	}
}

// mergeCompose merges override files as docker compose does for the fields
// the tests read: mappings merge key by key, command is replaced, volumes
// and ports are appended.
func mergeCompose(base compose, overrides ...compose) compose {
	out := compose{Services: map[string]composeService{}}
	for _, c := range append([]compose{base}, overrides...) {
		for name, o := range c.Services {
			s := out.Services[name]
			if o.Image != "" {
				s.Image = o.Image
			}
			if o.Command != nil {
				s.Command = o.Command
			}
			if o.Build.Target != "" {
				s.Build = o.Build
			}
			s.Environment = mergeMap(s.Environment, o.Environment)
			s.DependsOn = mergeMap(s.DependsOn, o.DependsOn)
			s.Volumes = append(s.Volumes, o.Volumes...)
			s.Ports = append(s.Ports, o.Ports...)
			s.Profiles = append(s.Profiles, o.Profiles...)
			out.Services[name] = s
		}
	}
	return out
}

func mergeMap(a, b map[string]any) map[string]any {
	out := map[string]any{}
	maps.Copy(out, a)
	maps.Copy(out, b)
	return out
}

// volumeAt returns the named volume mounted at dir.
func volumeAt(volumes []composeVolume, dir string) string {
	if v := mountAt(volumes, dir); v != nil && v.Type == "volume" {
		return v.Source
	}
	return ""
}

// mountAt is the mount whose target is path, nil if none.
func mountAt(volumes []composeVolume, path string) *composeVolume {
	for i, v := range volumes {
		if filepath.Clean(v.Target) == filepath.Clean(path) {
			return &volumes[i]
		}
	}
	return nil
}

// identitiesRun is what the compose service identities leaves in its
// volume, made here by the identity package from the same flags.
type identitiesRun struct {
	// volume is the compose volume it writes into; root is this test's copy
	// of it.
	volume, root string
	// seeds and out are --dir and --out, relative to the volume's root.
	seeds, out string
	keys       *identity.Keys
}

// runIdentities finds the compose service that runs `toolwire identities`,
// reads its flags with the CLI's own meaning (--dir, --out, --worker,
// --tenant) and makes, in a folder standing for its volume, the seeds and
// the accounts block it writes there.
func runIdentities(t *testing.T, c compose) identitiesRun {
	t.Helper()
	var found []string
	for name, svc := range c.Services {
		if len(svc.Command) > 0 && svc.Command[0] == "identities" {
			found = append(found, name)
		}
	}
	require.Len(t, found, 1, "one compose service runs toolwire identities")
	svc := c.Services[found[0]]
	require.Equal(t, "toolwire", svc.Build.Target, "identities runs the CLI's image")

	fs := flag.NewFlagSet("identities", flag.ContinueOnError)
	dir := fs.String("dir", "nats-identities", "")
	out := fs.String("out", "", "")
	var workers, tenants stringsFlag
	fs.Var(&workers, "worker", "")
	fs.Var(&tenants, "tenant", "")
	require.NoError(t, fs.Parse(svc.Command[1:]))
	require.Empty(t, fs.Args())
	require.NotEmpty(t, *out, "identities writes the accounts block to a file (--out)")

	// Both in one named volume, mounted on a folder the image gives its
	// user (uid 65532), so that Docker gives a new volume's root to it.
	require.Len(t, svc.Volumes, 1, "identities mounts its volume only")
	vol := svc.Volumes[0]
	require.Equal(t, "volume", vol.Type, "the seeds are kept in a named volume, across restarts")
	require.Equal(t, "/home/nonroot", filepath.Clean(vol.Target), "the distroless nonroot user's home, which it owns")
	require.Empty(t, vol.Volume.Subpath)
	run := identitiesRun{volume: vol.Source, root: t.TempDir()}
	for _, p := range []struct {
		flag string
		rel  *string
		abs  string
	}{{"--dir", &run.seeds, *dir}, {"--out", &run.out, *out}} {
		rel, err := filepath.Rel(vol.Target, p.abs)
		require.NoError(t, err)
		require.False(t, rel == ".." || strings.HasPrefix(rel, "../"), "identities %s %s is in its volume (%s)", p.flag, p.abs, vol.Target)
		*p.rel = rel
	}

	keys, err := identity.LoadOrCreate(filepath.Join(run.root, run.seeds))
	require.NoError(t, err)
	for _, s := range workers {
		w, err := identity.ParseWorker(s)
		require.NoError(t, err, "--worker %s", s)
		require.NoError(t, keys.AddWorker(w))
	}
	for _, s := range tenants {
		tn, err := identity.ParseTenant(s)
		require.NoError(t, err, "--tenant %s", s)
		require.NoError(t, keys.AddTenant(tn))
	}
	require.NoError(t, os.WriteFile(filepath.Join(run.root, run.out), []byte(keys.ServerConfig()), 0o644))
	run.keys = keys
	return run
}

type stringsFlag []string

func (f *stringsFlag) String() string     { return strings.Join(*f, ",") }
func (f *stringsFlag) Set(v string) error { *f = append(*f, v); return nil }

// natsServerOptions reads a compose NATS server's command line with
// nats-server's own flag parser, its config file and what the file
// includes laid out here as the container sees them: every file mounted
// in the config's folder, from the repository (a bind) or from the
// identities' volume (ids).
func natsServerOptions(t *testing.T, name string, svc composeService, ids identitiesRun) *server.Options {
	t.Helper()
	args := slices.Clone(svc.Command)
	i := slices.Index(args, "-c")
	require.GreaterOrEqual(t, i, 0, "%s runs nats-server with a config file (-c)", name)
	require.Less(t, i+1, len(args), name)
	conf := args[i+1]
	etc := t.TempDir()
	for _, v := range svc.Volumes {
		if filepath.Dir(filepath.Clean(v.Target)) != filepath.Dir(filepath.Clean(conf)) {
			continue
		}
		var src string
		switch {
		case v.Type == "bind":
			src = filepath.Join(repoRoot, v.Source)
		case v.Type == "volume" && v.Source == ids.volume:
			require.NotEmpty(t, v.Volume.Subpath, "%s mounts one file of %s, not the seeds", name, ids.volume)
			src = filepath.Join(ids.root, v.Volume.Subpath)
		default:
			t.Fatalf("%s: a mount in the config's folder this test does not know: %+v", name, v)
		}
		require.True(t, v.ReadOnly, "%s mounts %s read-only", name, v.Target)
		b, err := os.ReadFile(src)
		require.NoError(t, err, "%s mounts %s at %s", name, src, v.Target)
		require.NoError(t, os.WriteFile(filepath.Join(etc, filepath.Base(v.Target)), b, 0o644))
	}
	args[i+1] = filepath.Join(etc, filepath.Base(conf))
	require.FileExists(t, args[i+1], "%s mounts its config file %s", name, conf)
	opts, err := server.ConfigureOptions(flag.NewFlagSet(name, flag.ContinueOnError), args,
		func() {}, func() {}, func() {})
	require.NoError(t, err, "nats-server %s", strings.Join(svc.Command, " "))
	return opts
}

// TestComposeIdentities: docker-compose.yml runs NATS with toolwire's
// accounts and every client on an identity of its own. The identities
// service's flags, read as the CLI reads them, make (here, with the
// identity package) the seeds and the accounts block it writes into its
// volume; nats-server's own parser reads the server's command line, its
// config file and the generated block it includes, as the container has
// them; and every other service that reaches NATS mounts exactly one seed
// of that volume, its own, which identities makes, and is told where it is.
// Docker Hub is out of reach of the tests, so nothing here starts a
// container: docs/operations.md, "What checks them".
func TestComposeIdentities(t *testing.T) {
	for _, files := range [][]string{{"docker-compose.yml"}, {"docker-compose.yml", "docker-compose.cluster.yml"}} {
		t.Run(strings.Join(files, "+"), func(t *testing.T) {
			var cs []compose
			for _, f := range files {
				cs = append(cs, readCompose(t, filepath.Join(repoRoot, f)))
			}
			c := mergeCompose(cs[0], cs[1:]...)
			ids := runIdentities(t, c)

			// The seed each client must mount, by its compose service.
			want := map[string]string{
				"producer":       identity.SeedFile(ids.seeds, identity.Producer),
				"worker-example": identity.WorkerSeedFile(ids.seeds, identity.Worker{Queues: []string{"example"}}),
			}
			servers := 0
			for name, svc := range c.Services {
				if r, ok := identity.ForService(svc.Build.Target); ok {
					require.Equal(t, string(r), name, "the service of image %s", svc.Build.Target)
					want[name] = identity.SeedFile(ids.seeds, r)
				}
				if !strings.HasPrefix(svc.Image, "nats:") {
					continue
				}
				servers++
				opts := natsServerOptions(t, name, svc, ids)
				require.True(t, opts.JetStream, "%s runs JetStream", name)
				require.NotEmpty(t, volumeAt(svc.Volumes, opts.StoreDir), "%s keeps its store on a volume", name)
				require.Equal(t, 8222, opts.HTTPPort, "%s: monitoring, which KEDA and people read", name)
				accounts := map[string]bool{}
				for _, a := range opts.Accounts {
					accounts[a.Name] = true
				}
				for _, a := range ids.keys.Accounts() {
					require.True(t, accounts[a.Name], "%s has account %s", name, a.Name)
				}
				require.True(t, accounts[identity.SystemAccount])
				require.True(t, accounts[identity.WorkerAccount(identity.Worker{Queues: []string{"example"}})])
				require.Len(t, opts.Nkeys, len(identity.Roles())+len(ids.keys.Workers())+len(ids.keys.Tenants()),
					"%s lets in toolwire's identities", name)
				for _, u := range opts.Nkeys {
					require.NotNil(t, u.Account, "%s: user %s is in an account", name, u.Nkey)
				}
				require.Empty(t, opts.Users, "%s: no user/password users", name)
				require.Empty(t, opts.Username, "%s: no single user", name)
				require.Empty(t, opts.Authorization, "%s: no token", name)
				require.Empty(t, opts.NoAuthUser, "%s: no one gets in without credentials", name)
				for _, dep := range []string{"identities"} {
					require.Contains(t, svc.DependsOn, dep, "%s starts after its accounts are written", name)
				}
			}
			require.Equal(t, len(files)*2-1, servers, "NATS servers")

			mounted := map[string]string{}
			for name, svc := range c.Services {
				connects := svc.Environment["NATS_URL"] != nil || slices.Contains(svc.Command, "--nats") ||
					svc.Build.Target != "" && svc.Build.Target != "toolwire"
				if svc.Command != nil && svc.Command[0] == "identities" || strings.HasPrefix(svc.Image, "nats:") {
					continue
				}
				var seeds []composeVolume
				for _, v := range svc.Volumes {
					if v.Source == ids.volume {
						seeds = append(seeds, v)
					}
				}
				if !connects {
					require.Empty(t, seeds, "%s does not reach NATS and mounts no seed", name)
					continue
				}
				file, ok := want[name]
				require.True(t, ok, "%s reaches NATS: which identity is it? (add it to this test)", name)
				seedEnv := fmt.Sprint(svc.Environment[service.EnvNATSSeedFile])
				require.NotEmpty(t, svc.Environment[service.EnvNATSSeedFile], "%s runs with a seed (%s)", name, service.EnvNATSSeedFile)
				require.Len(t, seeds, 1, "%s mounts one file of %s: its seed", name, ids.volume)
				v := seeds[0]
				require.Equal(t, "volume", v.Type, name)
				require.Equal(t, seedEnv, v.Target, "%s reads its seed where it is mounted", name)
				require.Equal(t, file, v.Volume.Subpath, "%s mounts its own seed", name)
				require.True(t, v.ReadOnly, "%s mounts its seed read-only", name)
				require.NotContains(t, mounted, v.Volume.Subpath, "%s and %s share a seed", name, mounted[v.Volume.Subpath])
				mounted[v.Volume.Subpath] = name
				pub, err := identity.PublicKey(filepath.Join(ids.root, v.Volume.Subpath))
				require.NoError(t, err, "%s: identities makes %s", name, v.Volume.Subpath)
				require.NotEmpty(t, pub)
				require.Contains(t, svc.DependsOn, "identities", "%s starts after its seed is made", name)
				if name == "producer" {
					require.Equal(t, identity.Producer.InboxPrefix(), svc.Environment[service.EnvNATSInbox],
						"the CLI on the producer's seed replies under the producer's inbox")
				}
			}
			for _, r := range identity.Roles() {
				if _, ok := identity.ForService(string(r)); ok {
					require.Contains(t, mounted, identity.SeedFile(ids.seeds, r), "service %s runs, on its seed", r)
				}
			}
		})
	}
}
