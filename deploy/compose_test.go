package deploy

import (
	"flag"
	"fmt"
	"maps"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"
)

// TestComposeClusterOption: docker-compose.cluster.yml over docker-compose.yml
// makes three NATS servers one JetStream cluster (their command lines read by
// nats-server's own flag parser), and points every toolwire service at all of
// them with streams on as many replicas.
func TestComposeClusterOption(t *testing.T) {
	base := readCompose(t, filepath.Join(repoRoot, "docker-compose.yml"))
	over := readCompose(t, filepath.Join(repoRoot, "docker-compose.cluster.yml"))
	merged := mergeCompose(base, over)

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
		opts, err := server.ConfigureOptions(flag.NewFlagSet(name, flag.ContinueOnError), svc.Command,
			func() {}, func() {}, func() {})
		require.NoError(t, err, "nats-server %s", strings.Join(svc.Command, " "))
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
		if svc.Build.Target == "" {
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

// volumeAt returns the named volume mounted at dir ("name:/dir" short syntax).
func volumeAt(volumes []string, dir string) string {
	for _, v := range volumes {
		src, dst, _ := strings.Cut(v, ":")
		if dst == dir || strings.HasPrefix(dst, dir+":") {
			return src
		}
	}
	return ""
}
