package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/toolwire/toolwire/pkg/events/secrets"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/executor"
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
	for _, v := range slices.Concat(policy.EnvVars(), orchestrator.EnvVars(), sandbox.EnvVars(), executor.EnvVars(), recorder.EnvVars()) {
		m[v.Name] = true
	}
	return m
}

var toolwireServices = map[string]bool{"orchestrator": true, "policy": true, "executor": true, "sandbox": true, "recorder": true}

// TestDeploymentEnvMatchesBinaries: docker-compose.yml and deploy/k8s set only
// variables that the binaries read, so a typo cannot silently drop a setting.
func TestDeploymentEnvMatchesBinaries(t *testing.T) {
	known := knownEnv()
	check := func(where, name string) {
		t.Helper()
		require.True(t, known[name], "%s sets %s, which no toolwire binary reads", where, name)
	}

	b, err := os.ReadFile(filepath.Join("..", "docker-compose.yml"))
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
	seen := 0
	for name, svc := range compose.Services {
		if !toolwireServices[name] {
			continue
		}
		seen++
		require.Equal(t, name, svc.Build.Target, "compose service %s builds its own Dockerfile target", name)
		require.NotEmpty(t, svc.Environment, "compose service %s has no environment", name)
		for v := range svc.Environment {
			check("docker-compose.yml service "+name, v)
		}
	}
	require.Equal(t, len(toolwireServices), seen, "every service is in docker-compose.yml")

	files, err := filepath.Glob(filepath.Join("..", "deploy", "k8s", "*.yaml"))
	require.NoError(t, err)
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
