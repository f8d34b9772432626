package e2e

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/secrets"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/executor/standard"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/policy"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/sandbox"
)

// knownEnv is every variable some binary reads.
func knownEnv() map[string]bool {
	m := map[string]bool{}
	var common []string
	for _, v := range service.CommonEnvVars() {
		common = append(common, v.Name)
	}
	lists := [][]string{common,
		{secrets.EnvMasterKeys, secrets.EnvMasterKeyID}}
	for _, list := range lists {
		for _, v := range list {
			m[v] = true
		}
	}
	for _, v := range slices.Concat(policy.EnvVars(), orchestrator.EnvVars(), sandbox.EnvVars(), standard.EnvVars(), recorder.EnvVars()) {
		m[v.Name] = true
	}
	return m
}

var toolwireServices = map[string]bool{"orchestrator": true, "policy": true, "executor": true, "sandbox": true, "recorder": true}

// TestDeploymentEnvMatchesBinaries: docker-compose*.yml and deploy/k8s set only
// variables that the binaries read, so a typo cannot silently drop a setting,
// and KEDA's ScaledObjects watch the streams and consumers the services use.
func TestDeploymentEnvMatchesBinaries(t *testing.T) {
	known := knownEnv()
	check := func(where, name string) {
		t.Helper()
		require.True(t, known[name], "%s sets %s, which no toolwire binary reads", where, name)
	}

	// docker-compose.yml, and the override files beside it
	// (docker-compose.cluster.yml), which set only what they change.
	composeFiles, err := filepath.Glob(filepath.Join("..", "docker-compose*.yml"))
	require.NoError(t, err)
	for _, file := range composeFiles {
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		var compose struct {
			Services map[string]struct {
				Environment map[string]any `yaml:"environment"`
				Build       struct {
					Target string `yaml:"target"`
				} `yaml:"build"`
			} `yaml:"services"`
		}
		require.NoError(t, yaml.Unmarshal(b, &compose))
		base := filepath.Base(file) == "docker-compose.yml"
		seen := 0
		for name, svc := range compose.Services {
			if !toolwireServices[name] {
				continue
			}
			seen++
			if base || svc.Build.Target != "" {
				require.Equal(t, name, svc.Build.Target, "compose service %s builds its own Dockerfile target", name)
			}
			require.NotEmpty(t, svc.Environment, "%s service %s has no environment", filepath.Base(file), name)
			for v := range svc.Environment {
				check(filepath.Base(file)+" service "+name, v)
			}
		}
		if base {
			require.Equal(t, len(toolwireServices), seen, "every service is in docker-compose.yml")
		}
	}

	// deploy/k8s and the kustomizations under it (components, worker).
	var files []string
	require.NoError(t, filepath.WalkDir(filepath.Join("..", "deploy", "k8s"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && filepath.Ext(p) == ".yaml" {
			files = append(files, p)
		}
		return err
	}))
	deployments := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		dec := yaml.NewDecoder(strings.NewReader(string(b)))
		for {
			var doc struct {
				Kind     string                `yaml:"kind"`
				Metadata struct{ Name string } `yaml:"metadata"`
				Data     map[string]string     `yaml:"data"`
				Spec     struct {
					ScaleTargetRef struct{ Name string } `yaml:"scaleTargetRef"`
					Triggers       []struct {
						Type     string            `yaml:"type"`
						Metadata map[string]string `yaml:"metadata"`
					} `yaml:"triggers"`
					Template struct {
						Spec struct {
							Containers []struct {
								Name    string   `yaml:"name"`
								Command []string `yaml:"command"`
								Env     []struct {
									Name string `yaml:"name"`
								} `yaml:"env"`
							} `yaml:"containers"`
						} `yaml:"spec"`
					} `yaml:"template"`
				} `yaml:"spec"`
			}
			if err := dec.Decode(&doc); err != nil {
				break
			}
			switch doc.Kind {
			case "ConfigMap":
				for v := range doc.Data {
					check(filepath.Base(f)+" ConfigMap "+doc.Metadata.Name, v)
				}
			case "ScaledObject":
				// KEDA scales on the backlog of the consumer the code names.
				for _, tr := range doc.Spec.Triggers {
					if tr.Type != "nats-jetstream" {
						continue
					}
					where := filepath.Base(f) + " ScaledObject " + doc.Metadata.Name
					stream, consumer := tr.Metadata["stream"], tr.Metadata["consumer"]
					switch doc.Spec.ScaleTargetRef.Name {
					case "executor":
						require.Equal(t, events.StreamCalls, stream, where)
						require.Equal(t, executor.Durable, consumer, where)
					case "sandbox":
						require.Equal(t, events.StreamSandbox, stream, where)
						require.Equal(t, sandbox.Durable, consumer, where)
					default: // a worker: a queue's consumer of approved calls
						require.Equal(t, events.StreamCalls, stream, where)
						require.NotEqual(t, executor.Durable, consumer, where)
					}
				}
			case "Deployment":
				deployments[doc.Metadata.Name] = true
				for _, c := range doc.Spec.Template.Spec.Containers {
					for _, e := range c.Env {
						check(filepath.Base(f)+" container "+c.Name, e.Name)
					}
				}
			}
		}
	}
	var names []string
	for n := range deployments {
		names = append(names, n)
	}
	sort.Strings(names)
	for s := range toolwireServices {
		require.True(t, deployments[s], "deploy/k8s has a Deployment for %s (have %v)", s, names)
	}
}
