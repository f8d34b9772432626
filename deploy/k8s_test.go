package deploy

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
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
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	k8sjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// rendered is a kustomization's output, decoded.
type rendered struct {
	deployments   map[string]*appsv1.Deployment
	configMaps    map[string]*corev1.ConfigMap
	services      map[string]*corev1.Service
	runtimeClass  map[string]*nodev1.RuntimeClass
	hpas          map[string]*autoscalingv2.HorizontalPodAutoscaler
	scaledObjects map[string]*scaledObject
	namespaces    map[string]bool
	// namespaceOf is each object's metadata.namespace, by kind/name.
	namespaceOf map[string]string
}

// render builds the kustomization in dir in-process, with the kustomize
// library `kubectl kustomize` embeds, and decodes every object strictly
// (unknown or duplicate fields fail) into the Kubernetes API types, or, for
// KEDA's ScaledObject, into scaledObject.
func render(t *testing.T, dir string) *rendered {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	resMap, err := k.Run(filesys.MakeFsOnDisk(), dir)
	require.NoError(t, err, "kustomize build %s", dir)

	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{appsv1.AddToScheme, corev1.AddToScheme,
		policyv1.AddToScheme, nodev1.AddToScheme, autoscalingv2.AddToScheme} {
		require.NoError(t, add(scheme))
	}
	strict := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme, scheme,
		kjson.SerializerOptions{Yaml: true, Strict: true})

	r := &rendered{
		deployments: map[string]*appsv1.Deployment{}, configMaps: map[string]*corev1.ConfigMap{},
		services: map[string]*corev1.Service{}, runtimeClass: map[string]*nodev1.RuntimeClass{},
		hpas: map[string]*autoscalingv2.HorizontalPodAutoscaler{}, scaledObjects: map[string]*scaledObject{},
		namespaces: map[string]bool{}, namespaceOf: map[string]string{},
	}
	for _, res := range resMap.Resources() {
		b, err := res.AsYAML()
		require.NoError(t, err)
		kind, name := res.GetKind(), res.GetName()
		what := kind + "/" + name
		r.namespaceOf[what] = res.GetNamespace()
		if res.GetApiVersion() == "keda.sh/v1alpha1" && kind == "ScaledObject" {
			r.scaledObjects[name] = decodeScaledObject(t, what, b)
			continue
		}
		gvk := schema.FromAPIVersionAndKind(res.GetApiVersion(), kind)
		obj, _, err := strict.Decode(b, &gvk, nil)
		require.NoError(t, err, "%s (%s) does not decode into the Kubernetes API types", what, res.GetApiVersion())
		switch o := obj.(type) {
		case *appsv1.Deployment:
			r.deployments[name] = o
		case *corev1.ConfigMap:
			r.configMaps[name] = o
		case *corev1.Service:
			r.services[name] = o
		case *corev1.Namespace:
			r.namespaces[name] = true
		case *nodev1.RuntimeClass:
			r.runtimeClass[name] = o
		case *autoscalingv2.HorizontalPodAutoscaler:
			r.hpas[name] = o
		case *policyv1.PodDisruptionBudget:
		default:
			t.Fatalf("%s: a kind this test does not check (%T): add it here", what, obj)
		}
	}
	return r
}

// decodeScaledObject decodes as the API server does: field names are case
// sensitive (encoding/json's are not), and an unknown or duplicate field fails.
func decodeScaledObject(t *testing.T, what string, b []byte) *scaledObject {
	t.Helper()
	j, err := yaml.YAMLToJSON(b)
	require.NoError(t, err, what)
	var so scaledObject
	strictErrs, err := k8sjson.UnmarshalStrict(j, &so)
	require.NoError(t, err, what)
	require.NoError(t, errors.Join(strictErrs...), "%s: not a ScaledObject KEDA reads", what)
	return &so
}

// scaledObject is KEDA's ScaledObject (keda.sh/v1alpha1) as its CRD defines
// it, the fields we use and their neighbours; decoded strictly, a misspelt
// field fails the test instead of being dropped by the API server.
type scaledObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace"`
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		ScaleTargetRef struct {
			APIVersion             string `json:"apiVersion"`
			Kind                   string `json:"kind"`
			Name                   string `json:"name"`
			EnvSourceContainerName string `json:"envSourceContainerName"`
		} `json:"scaleTargetRef"`
		PollingInterval       *int32 `json:"pollingInterval"`
		InitialCooldownPeriod *int32 `json:"initialCooldownPeriod"`
		CooldownPeriod        *int32 `json:"cooldownPeriod"`
		IdleReplicaCount      *int32 `json:"idleReplicaCount"`
		MinReplicaCount       *int32 `json:"minReplicaCount"`
		MaxReplicaCount       *int32 `json:"maxReplicaCount"`
		Advanced              *struct {
			HorizontalPodAutoscalerConfig *struct {
				Name     string                                         `json:"name"`
				Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior"`
			} `json:"horizontalPodAutoscalerConfig"`
			RestoreToOriginalReplicaCount bool `json:"restoreToOriginalReplicaCount"`
		} `json:"advanced"`
		Fallback *struct {
			FailureThreshold int32  `json:"failureThreshold"`
			Replicas         int32  `json:"replicas"`
			Behavior         string `json:"behavior"`
		} `json:"fallback"`
		Triggers []struct {
			Type              string            `json:"type"`
			Name              string            `json:"name"`
			MetricType        string            `json:"metricType"`
			UseCachedMetrics  bool              `json:"useCachedMetrics"`
			Metadata          map[string]string `json:"metadata"`
			AuthenticationRef *struct {
				Name string `json:"name"`
				Kind string `json:"kind"`
			} `json:"authenticationRef"`
		} `json:"triggers"`
	} `json:"spec"`
}

// natsValues is the part of deploy/nats/values.yaml (the NATS Helm chart's
// values) that deploy/k8s depends on.
type natsValues struct {
	FullnameOverride  string `json:"fullnameOverride"`
	NamespaceOverride string `json:"namespaceOverride"`
	Config            struct {
		Cluster struct {
			Enabled  bool `json:"enabled"`
			Replicas int  `json:"replicas"`
		} `json:"cluster"`
		JetStream struct {
			Enabled   bool `json:"enabled"`
			FileStore struct {
				Enabled bool   `json:"enabled"`
				Dir     string `json:"dir"`
				PVC     struct {
					Enabled bool   `json:"enabled"`
					Size    string `json:"size"`
				} `json:"pvc"`
			} `json:"fileStore"`
			MemoryStore struct {
				Enabled bool `json:"enabled"`
			} `json:"memoryStore"`
		} `json:"jetstream"`
		NATS    struct{ Port int } `json:"nats"`
		Monitor struct {
			Enabled bool `json:"enabled"`
			Port    int  `json:"port"`
		} `json:"monitor"`
		// Merge is merged into the chart's nats.conf; a key ending in
		// $include becomes an include directive.
		Merge map[string]any `json:"merge"`
	} `json:"config"`
	Container struct {
		Patch []jsonPatch `json:"patch"`
	} `json:"container"`
	PodTemplate struct {
		Patch []jsonPatch `json:"patch"`
	} `json:"podTemplate"`
}

// jsonPatch is one operation of the chart's JSON patches, decoded strictly
// into what it adds.
type jsonPatch struct {
	Op    string          `json:"op"`
	Path  string          `json:"path"`
	Value json.RawMessage `json:"value"`
}

// natsConfigDir is where the NATS chart mounts its nats.conf.
const natsConfigDir = "/etc/nats-config"

func readNATSValues(t *testing.T) natsValues {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("nats", "values.yaml"))
	require.NoError(t, err)
	var v natsValues
	// Not strict: the file sets chart values this test has no opinion on.
	require.NoError(t, yaml.Unmarshal(b, &v))
	return v
}

// kustomizationNamespace is the namespace deploy/k8s puts everything in.
func kustomizationNamespace(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	require.NoError(t, err)
	var k struct {
		Namespace string `json:"namespace"`
	}
	require.NoError(t, yaml.Unmarshal(b, &k))
	require.NotEmpty(t, k.Namespace)
	return k.Namespace
}

// scaled are the Deployments that KEDA scales on a JetStream consumer, and
// the variable that says how much work one pod takes at once.
var scaled = map[string]string{
	"executor": "TOOLWIRE_EXECUTOR_CONCURRENCY",
	"sandbox":  "TOOLWIRE_SANDBOX_CONCURRENCY",
}

func TestKubernetesManifests(t *testing.T) {
	dir := "k8s"
	r := render(t, dir)
	ns := kustomizationNamespace(t, dir)
	nats := readNATSValues(t)

	t.Run("namespaces", func(t *testing.T) {
		require.True(t, r.namespaces[ns], "the kustomization creates its namespace %s", ns)
		for what, got := range r.namespaceOf {
			switch {
			case strings.HasPrefix(what, "Namespace/"), strings.HasPrefix(what, "RuntimeClass/"):
				require.Empty(t, got, "%s is cluster-scoped", what)
			default:
				require.Equal(t, ns, got, what)
			}
		}
	})

	t.Run("NATS from the Helm values", func(t *testing.T) {
		require.Equal(t, ns, nats.NamespaceOverride, "the NATS chart installs into toolwire's namespace")
		require.True(t, nats.Config.Cluster.Enabled)
		require.True(t, nats.Config.JetStream.Enabled)
		require.True(t, nats.Config.JetStream.FileStore.Enabled, "streams are file-backed")
		require.True(t, nats.Config.JetStream.FileStore.PVC.Enabled, "on persistent volumes")
		require.NotEmpty(t, nats.Config.JetStream.FileStore.PVC.Size)
		require.True(t, nats.Config.Monitor.Enabled, "KEDA reads /jsz on the monitoring port")

		env := r.configMaps["toolwire-env"]
		require.NotNil(t, env, "the shared ConfigMap toolwire-env")
		u, err := url.Parse(env.Data["NATS_URL"])
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("%s.%s.svc", nats.FullnameOverride, ns), u.Hostname(),
			"NATS_URL names the chart's client Service")
		require.Equal(t, strconv.Itoa(natsPort(nats)), u.Port())

		replicas, err := strconv.Atoi(env.Data["TOOLWIRE_STREAM_REPLICAS"])
		require.NoError(t, err)
		require.Equal(t, 3, replicas, "streams are R3 on the cluster")
		require.GreaterOrEqual(t, nats.Config.Cluster.Replicas, replicas, "no more stream replicas than servers")
	})

	t.Run("services read their settings", func(t *testing.T) {
		for _, name := range []string{"orchestrator", "policy", "executor", "sandbox", "recorder"} {
			d := r.deployments[name]
			require.NotNil(t, d, "a Deployment for %s", name)
			c := d.Spec.Template.Spec.Containers[0]
			require.True(t, slices.ContainsFunc(c.EnvFrom, func(e corev1.EnvFromSource) bool {
				return e.ConfigMapRef != nil && r.configMaps[e.ConfigMapRef.Name] != nil
			}), "%s takes NATS_URL and the shared settings from a ConfigMap of the kustomization", name)
			checkHTTPPort(t, d)
		}
		db := envVar(r.deployments["recorder"].Spec.Template.Spec.Containers[0], "DATABASE_URL")
		require.NotNil(t, db, "the recorder has DATABASE_URL")
		require.NotNil(t, db.ValueFrom, "from a Secret, not written in the manifest")
		require.NotNil(t, db.ValueFrom.SecretKeyRef)
	})

	t.Run("NATS identities", func(t *testing.T) {
		secrets := map[string]string{}
		for _, name := range []string{"orchestrator", "policy", "executor", "sandbox", "recorder"} {
			d := r.deployments[name]
			require.NotNil(t, d, name)
			secret := checkSeed(t, d)
			require.Equal(t, "toolwire-nats-"+name, secret, "%s runs on its own role's seed", name)
			require.NotContains(t, secrets, secret, "%s and %s share a seed", name, secrets[secret])
			secrets[secret] = name
		}
		require.Len(t, r.deployments, len(secrets), "every Deployment runs on a seed of its own")
		checkSecretsDocumented(t, secrets)
	})

	t.Run("NATS lets in toolwire's accounts", func(t *testing.T) {
		checkNATSAccounts(t, nats)
	})

	t.Run("KEDA scales on the consumers' backlog", func(t *testing.T) {
		for name, concurrencyVar := range scaled {
			so := r.scaledObjects[name]
			require.NotNil(t, so, "a ScaledObject for %s", name)
			d := checkScaledObject(t, r, so, ns, nats)
			require.Equal(t, name, d.Name)
			conc := envVar(d.Spec.Template.Spec.Containers[0], concurrencyVar)
			require.NotNil(t, conc, "%s sets %s", name, concurrencyVar)
			require.Equal(t, conc.Value, jetstreamTrigger(t, so)["lagThreshold"],
				"%s: a pod's worth of backlog is what one pod runs at once (%s)", name, concurrencyVar)
		}
		for _, h := range r.hpas {
			_, owned := r.scaledObjects[h.Spec.ScaleTargetRef.Name]
			require.False(t, owned, "HorizontalPodAutoscaler %s fights KEDA's for %s", h.Name, h.Spec.ScaleTargetRef.Name)
		}
	})

	t.Run("the sandbox runs on gVisor", func(t *testing.T) {
		spec := r.deployments["sandbox"].Spec.Template.Spec
		require.NotNil(t, spec.RuntimeClassName, "the sandbox Deployment names a RuntimeClass")
		rc := r.runtimeClass[*spec.RuntimeClassName]
		require.NotNil(t, rc, "RuntimeClass %s is in the kustomization", *spec.RuntimeClassName)
		require.Equal(t, "runsc", rc.Handler, "gVisor's containerd handler")
		require.NotNil(t, rc.Scheduling, "pods go only to nodes that have gVisor")
		require.NotEmpty(t, rc.Scheduling.NodeSelector)
		for name, d := range r.deployments {
			if name != "sandbox" {
				require.Nil(t, d.Spec.Template.Spec.RuntimeClassName, "%s runs on the default runtime", name)
			}
		}
	})
}

// TestWorkerTemplate: deploy/k8s/worker renders, and its ScaledObject scales
// its Deployment on a consumer of the calls stream.
func TestWorkerTemplate(t *testing.T) {
	base := render(t, "k8s")
	dir := filepath.Join("k8s", "worker")
	r := render(t, dir)
	ns := kustomizationNamespace(t, dir)
	require.Equal(t, kustomizationNamespace(t, "k8s"), ns, "workers join the services' namespace")
	require.Len(t, r.scaledObjects, 1)
	for _, so := range r.scaledObjects {
		d := checkScaledObject(t, r, so, ns, readNATSValues(t))
		trig := jetstreamTrigger(t, so)
		require.Equal(t, "TOOLWIRE_CALLS", trig["stream"], "workers consume approved calls")
		require.NotEqual(t, "executor", trig["consumer"], "a worker's queue has a consumer of its own")
		c := d.Spec.Template.Spec.Containers[0]
		require.True(t, slices.ContainsFunc(c.EnvFrom, func(e corev1.EnvFromSource) bool {
			return e.ConfigMapRef != nil && base.configMaps[e.ConfigMapRef.Name] != nil
		}), "the worker takes the shared settings from deploy/k8s's ConfigMap")
		checkHTTPPort(t, d)
		secret := checkSeed(t, d)
		require.Equal(t, "toolwire-nats-worker-example", secret, "the worker of queue example runs on its worker identity's seed")
		checkSecretsDocumented(t, map[string]string{secret: d.Name})
	}
}

// checkSeed: the Deployment's container reads its NATS seed
// (TOOLWIRE_NATS_NKEY_SEED_FILE) from a memory volume it mounts read-only,
// where an init container running `toolwire identities copy-seed` as the
// pod's user put it, from a Secret volume only that init container mounts.
// It returns the Secret's name.
func checkSeed(t *testing.T, d *appsv1.Deployment) string {
	t.Helper()
	spec := d.Spec.Template.Spec
	c := spec.Containers[0]
	env := envVar(c, service.EnvNATSSeedFile)
	require.NotNil(t, env, "%s runs with a seed (%s)", d.Name, service.EnvNATSSeedFile)
	require.Nil(t, envVar(c, service.EnvNATSCreds), d.Name)
	seed := env.Value
	require.True(t, filepath.IsAbs(seed), d.Name)
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	mountOf := func(c corev1.Container, path string) *corev1.VolumeMount {
		for i, m := range c.VolumeMounts {
			if m.MountPath == filepath.Dir(path) {
				return &c.VolumeMounts[i]
			}
		}
		return nil
	}
	m := mountOf(c, seed)
	require.NotNil(t, m, "%s mounts the folder of its seed %s", d.Name, seed)
	require.True(t, m.ReadOnly, "%s mounts its seed read-only", d.Name)
	mem := volumes[m.Name]
	require.NotNil(t, mem.EmptyDir, "%s: the seed is in an emptyDir", d.Name)
	require.Equal(t, corev1.StorageMediumMemory, mem.EmptyDir.Medium, "%s: the seed stays off the node's disk", d.Name)

	var copies []corev1.Container
	for _, ic := range spec.InitContainers {
		if i := slices.Index(ic.Command, "copy-seed"); i >= 2 && ic.Command[i-1] == "identities" {
			copies = append(copies, ic)
		}
	}
	require.Len(t, copies, 1, "%s: an init container copies the seed", d.Name)
	ic := copies[0]
	require.True(t, strings.HasPrefix(ic.Image, "ghcr.io/toolwire/toolwire:"), "%s: the CLI's image copies it (%s)", d.Name, ic.Image)
	args := ic.Command[slices.Index(ic.Command, "copy-seed")+1:]
	require.Len(t, args, 2, "%s: copy-seed SRC DST", d.Name)
	src, dst := args[0], args[1]
	require.Equal(t, seed, dst, "%s: the copy is where the service reads its seed", d.Name)
	dm := mountOf(ic, dst)
	require.NotNil(t, dm, d.Name)
	require.Equal(t, m.Name, dm.Name, "%s: the init container writes into the service's seed volume", d.Name)
	require.False(t, dm.ReadOnly, d.Name)
	sm := mountOf(ic, src)
	require.NotNil(t, sm, "%s: the init container mounts the Secret", d.Name)
	require.True(t, sm.ReadOnly, d.Name)
	sec := volumes[sm.Name].Secret
	require.NotNil(t, sec, "%s: the seed comes from a Secret", d.Name)
	require.Empty(t, sec.Items, "%s: the Secret's key is the file name", d.Name)
	require.Equal(t, "seed.nk", filepath.Base(src), "%s: the Secret's key, as deploy/README.md creates it", d.Name)
	require.Nil(t, mountOf(c, src), "%s: the service itself does not mount the Secret", d.Name)
	for _, cc := range spec.Containers {
		for _, vm := range cc.VolumeMounts {
			require.NotEqual(t, sm.Name, vm.Name, "%s: container %s mounts the seed's Secret", d.Name, cc.Name)
		}
	}
	// The copy belongs to the user the service runs as.
	if ic.SecurityContext != nil {
		require.Nil(t, ic.SecurityContext.RunAsUser, "%s: the init container runs as the pod's user", d.Name)
		require.Nil(t, ic.SecurityContext.RunAsGroup, d.Name)
	}
	if c.SecurityContext != nil {
		require.Nil(t, c.SecurityContext.RunAsUser, "%s: the service runs as the pod's user", d.Name)
	}
	require.NotNil(t, spec.SecurityContext.RunAsUser, d.Name)
	return sec.SecretName
}

// checkSecretsDocumented: deploy/README.md says how to create each Secret.
func checkSecretsDocumented(t *testing.T, secrets map[string]string) {
	t.Helper()
	b, err := os.ReadFile("README.md")
	require.NoError(t, err)
	for secret, who := range secrets {
		require.True(t, strings.Contains(string(b), secret), "deploy/README.md creates the Secret %s of %s", secret, who)
	}
}

// checkNATSAccounts: the NATS chart's values include toolwire's accounts
// block from the Secret toolwire-nats-accounts, mounted where the include
// points; nats-server's parser reads a config as the chart's include makes
// it, over a block made here by the identity package, with every account.
func checkNATSAccounts(t *testing.T, v natsValues) {
	t.Helper()
	var includes []string
	for k, val := range v.Config.Merge {
		if strings.HasSuffix(k, "$include") {
			includes = append(includes, fmt.Sprint(val))
		}
	}
	require.Len(t, includes, 1, "the chart's config includes the accounts block")
	inc := filepath.Join(natsConfigDir, includes[0])

	var mounts []corev1.VolumeMount
	for _, p := range v.Container.Patch {
		require.Equal(t, "add", p.Op)
		require.Equal(t, "/volumeMounts/-", p.Path)
		var m corev1.VolumeMount
		require.NoError(t, k8sjson.UnmarshalCaseSensitivePreserveInts(p.Value, &m))
		mounts = append(mounts, m)
	}
	i := slices.IndexFunc(mounts, func(m corev1.VolumeMount) bool { return m.MountPath == filepath.Dir(inc) })
	require.GreaterOrEqual(t, i, 0, "the NATS container mounts the folder of %s", inc)
	require.True(t, mounts[i].ReadOnly)
	var secret string
	for _, p := range v.PodTemplate.Patch {
		require.Equal(t, "add", p.Op)
		require.Equal(t, "/spec/volumes/-", p.Path)
		var vol corev1.Volume
		require.NoError(t, k8sjson.UnmarshalCaseSensitivePreserveInts(p.Value, &vol))
		if vol.Name == mounts[i].Name {
			require.NotNil(t, vol.Secret, "the accounts block comes from a Secret")
			secret = vol.Secret.SecretName
		}
	}
	require.Equal(t, "toolwire-nats-accounts", secret)
	checkSecretsDocumented(t, map[string]string{secret: "NATS"})

	// The chart's config folder and the Secret's, with a block of every
	// kind of identity.
	root := t.TempDir()
	keys, err := identity.LoadOrCreate(filepath.Join(root, "seeds"))
	require.NoError(t, err)
	require.NoError(t, keys.AddWorker(identity.Worker{Queues: []string{"example"}}))
	require.NoError(t, keys.AddTenant(identity.Tenant{Org: "acme"}))
	etc := filepath.Join(root, "etc")
	for _, dir := range []string{natsConfigDir, filepath.Dir(inc)} {
		require.NoError(t, os.MkdirAll(filepath.Join(etc, dir), 0o700))
	}
	require.NoError(t, os.WriteFile(filepath.Join(etc, inc), []byte(keys.ServerConfig()), 0o600))
	conf := filepath.Join(etc, natsConfigDir, "nats.conf")
	require.NoError(t, os.WriteFile(conf, []byte(fmt.Sprintf("jetstream { store_dir: %q }\ninclude %q\n",
		filepath.Join(root, "js"), includes[0])), 0o600))
	opts, err := server.ProcessConfigFile(conf)
	require.NoError(t, err, "nats-server reads the chart's include")
	names := map[string]bool{}
	for _, a := range opts.Accounts {
		names[a.Name] = true
	}
	for _, a := range keys.Accounts() {
		require.True(t, names[a.Name], "account %s", a.Name)
	}
	require.Len(t, opts.Nkeys, len(identity.Roles())+2)
}

// checkScaledObject checks what every ScaledObject of ours needs and returns
// the Deployment it scales.
func checkScaledObject(t *testing.T, r *rendered, so *scaledObject, ns string, nats natsValues) *appsv1.Deployment {
	t.Helper()
	name := so.Metadata.Name
	ref := so.Spec.ScaleTargetRef
	require.Equal(t, "apps/v1", ref.APIVersion, name)
	require.Equal(t, "Deployment", ref.Kind, name)
	d := r.deployments[ref.Name]
	require.NotNil(t, d, "ScaledObject %s scales Deployment %s, which the kustomization has", name, ref.Name)

	require.NotNil(t, so.Spec.MinReplicaCount)
	require.NotNil(t, so.Spec.MaxReplicaCount)
	lo, hi := *so.Spec.MinReplicaCount, *so.Spec.MaxReplicaCount
	require.GreaterOrEqual(t, lo, int32(1), "%s never scales to zero: a queue with no consumer fails its calls", name)
	require.Greater(t, hi, lo, name)
	require.NotNil(t, d.Spec.Replicas)
	require.True(t, *d.Spec.Replicas >= lo && *d.Spec.Replicas <= hi, "%s: the Deployment starts within KEDA's bounds", name)
	if fb := so.Spec.Fallback; fb != nil {
		require.GreaterOrEqual(t, fb.Replicas, lo, "%s: fallback keeps at least the minimum", name)
	}

	trig := jetstreamTrigger(t, so)
	for _, k := range []string{"account", "stream", "consumer", "lagThreshold"} {
		require.NotEmpty(t, trig[k], "%s: nats-jetstream trigger sets %s", name, k)
	}
	require.Equal(t, identity.SystemAccount, trig["account"], "%s: the streams are in toolwire's system account", name)
	lag, err := strconv.Atoi(trig["lagThreshold"])
	require.NoError(t, err)
	require.Positive(t, lag)
	host, port, err := net.SplitHostPort(trig["natsServerMonitoringEndpoint"])
	require.NoError(t, err, name)
	require.Equal(t, fmt.Sprintf("%s-headless.%s.svc.cluster.local", nats.FullnameOverride, ns), host,
		"%s: KEDA asks the chart's headless Service, whose pods it reaches by server name", name)
	require.Equal(t, strconv.Itoa(nats.Config.Monitor.Port), port, name)

	for _, tr := range so.Spec.Triggers {
		switch tr.Type {
		case "nats-jetstream":
		case "cpu", "memory":
			require.Equal(t, "Utilization", tr.MetricType, name)
			_, err := strconv.Atoi(tr.Metadata["value"])
			require.NoError(t, err, "%s: %s trigger value", name, tr.Type)
			for _, c := range d.Spec.Template.Spec.Containers {
				_, ok := c.Resources.Requests[corev1.ResourceName(tr.Type)]
				require.True(t, ok, "%s: a %s trigger needs %s requests on container %s", name, tr.Type, tr.Type, c.Name)
			}
		default:
			t.Fatalf("%s: trigger %q is not one this test checks", name, tr.Type)
		}
	}
	return d
}

func jetstreamTrigger(t *testing.T, so *scaledObject) map[string]string {
	t.Helper()
	for _, tr := range so.Spec.Triggers {
		if tr.Type == "nats-jetstream" {
			return tr.Metadata
		}
	}
	t.Fatalf("ScaledObject %s has no nats-jetstream trigger", so.Metadata.Name)
	return nil
}

// checkHTTPPort: the port in TOOLWIRE_HTTP_ADDR is the container port that
// the probes and the scrape annotation use.
func checkHTTPPort(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	c := d.Spec.Template.Spec.Containers[0]
	addr := envVar(c, "TOOLWIRE_HTTP_ADDR")
	require.NotNil(t, addr, "%s sets TOOLWIRE_HTTP_ADDR", d.Name)
	_, port, err := net.SplitHostPort(addr.Value)
	require.NoError(t, err, d.Name)
	idx := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "http" })
	require.GreaterOrEqual(t, idx, 0, "%s has a container port named http", d.Name)
	require.Equal(t, port, strconv.Itoa(int(c.Ports[idx].ContainerPort)), "%s listens where its port says", d.Name)
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
		require.NotNil(t, p, d.Name)
		require.NotNil(t, p.HTTPGet, d.Name)
		require.Equal(t, "http", p.HTTPGet.Port.String(), d.Name)
	}
	require.Equal(t, port, d.Spec.Template.Annotations["prometheus.io/port"], "%s is scraped on its port", d.Name)
}

func envVar(c corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

func natsPort(v natsValues) int {
	if v.Config.NATS.Port != 0 {
		return v.Config.NATS.Port
	}
	return 4222 // the chart's default
}
