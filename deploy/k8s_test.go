package deploy

import (
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

	"github.com/stretchr/testify/require"
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
	} `json:"config"`
}

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
	}
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
