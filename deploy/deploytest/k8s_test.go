package deploytest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"

	"redcell/api"
	"redcell/sharding"
)

// Paths from this package's directory.
const (
	k8sDir           = "../k8s"
	k8sSecretsDir    = "secrets" // under k8sDir: secrets.sh's files, never committed
	composeFile      = "../compose/compose.yaml"
	composeConfig    = "../compose/redcell.yaml"
	redcellImage     = "redcell:dev" // docker build -t redcell:dev . (Dockerfile, Compose)
	redcellImageName = "redcell"     // the name kustomization.yaml's images entry rewrites
	redcellBinary    = "/usr/local/bin/redcell"
)

// How long a process may take to stop after SIGTERM, from the code
// (docs/architecture.md, Graceful shutdown). A cell leaves the gossip (up to
// 3 s, cmd/redcell/serve.go), lets in-flight requests finish (up to 15 s,
// cell.Server.Serve), answers its queued opens (an open's transaction: 5 s)
// and flushes its relay lanes (5 s). A router lets in-flight requests finish
// (15 s, router.Router.Serve), then leaves the gossip (2 s). MariaDB's clean
// shutdown gets at least mariadbStopMin.
const (
	cellDrainMax   = (3 + 15 + 5 + 5) * time.Second
	routerDrainMax = (15 + 2) * time.Second
	mariadbStopMin = 30 * time.Second
	// routerPreStopMin: long enough for the endpoint removal to reach every
	// node's proxy before the router stops taking connections.
	routerPreStopMin = 5 * time.Second
)

// TestKubernetesManifests checks deploy/k8s without a cluster. Every YAML
// document is decoded strictly (an unknown field, a duplicate key or a value
// of the wrong type is an error) into the Kubernetes API's own Go types, by
// its apiVersion and kind; a kind not listed in k8sKinds is an error. Then:
//   - the cross-references Kubernetes resolves only when it runs the objects:
//     Service selectors and target ports, StatefulSets' headless Services,
//     Secret and ConfigMap keys of volumes and env, probe and hook ports,
//     $(VAR) references, PodDisruptionBudget selectors (checkK8sRefs);
//   - the cluster they describe is the Compose file's: two routers, three
//     cells each with its own MariaDB run with the Compose file's flags, one
//     memcached, probes on the paths the processes serve, grace periods that
//     cover the drains, nothing in the shell-less image that needs a shell
//     (checkK8sLayout);
//   - the cluster config in the ConfigMap loads with redcell's own loader and
//     validators (cmd/redcell's loadConfig, cellConfig, routerConfig), in each
//     pod as its containers see it: its env (a made-up pod IP for the
//     downward API's status.podIP), its Secret and ConfigMap files where they
//     are mounted. Every address it names is a Service and port of the
//     manifests, or one the process binds on every address of its pod; and
//     what each process announces (cmd/redcell's advertised and
//     cellAdvertise, as serve.go calls them) is the pod's IP with the port
//     of the container the others dial (checkK8sConfig).
//
// The subtests named refuses_* break one thing each and check that it is
// found, so the checks can fail.
func TestKubernetesManifests(t *testing.T) {
	files := readK8sFiles(t)
	m, err := decodeK8s(files)
	if err != nil {
		t.Fatalf("deploy/k8s does not decode: %v", err)
	}
	compose := readCompose(t)
	start := time.Now()
	bin := buildConfigDumper(t)
	t.Logf("built redcell with the config dumper in %s", time.Since(start).Round(time.Millisecond))

	for _, p := range checkK8sRefs(m) {
		t.Errorf("reference: %s", p)
	}
	for _, p := range checkK8sLayout(m, compose) {
		t.Errorf("layout: %s", p)
	}
	for _, p := range checkK8sConfig(t, m, bin, compose) {
		t.Errorf("config: %s", p)
	}
	checkK8sScripts(t, m)
	if !t.Failed() {
		t.Logf("%d files, %d Services, %d Deployments, %d StatefulSets, %d PodDisruptionBudgets, Secret keys %v",
			len(m.files), len(m.services), len(m.deployments), len(m.statefulSets), len(m.pdbs), keys(m.secrets["redcell-secrets"]))
	}

	// The decoder refuses what the API server would.
	decodeFails := []struct {
		name, file, old, new, want string
	}{
		{"unknown_field", "router.yaml", "readinessProbe:", "readinesProbe:", `unknown field "readinesProbe"`},
		{"unknown_kind", "memcached.yaml", "kind: Deployment", "kind: Deploymnet", "apps/v1 Deploymnet: a kind deploy/k8s does not use"},
		{"duplicate_key", "router.yaml", "  replicas: 2\n", "  replicas: 2\n  replicas: 3\n", `"replicas" already set`},
		{"wrong_type", "router.yaml", "  replicas: 2\n", "  replicas: two\n", "cannot unmarshal string"},
		{"kustomization_field", "kustomization.yaml", "namespace: redcell", "namespaces: redcell", `unknown field "namespaces"`},
	}
	for _, c := range decodeFails {
		t.Run("refuses_"+c.name, func(t *testing.T) {
			_, err := decodeK8s(mutateFile(t, files, c.file, c.old, c.new))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("decoding with %q for %q in %s: got %v, want an error with %q", c.new, c.old, c.file, err, c.want)
			}
		})
	}

	// The checks find a broken reference.
	refFails := []struct {
		name   string
		mutate func(t *testing.T, m *k8sManifests)
		want   string
	}{
		{"service_selector", func(t *testing.T, m *k8sManifests) {
			m.services["redcell-router"].Spec.Selector["app.kubernetes.io/component"] = "routers"
		}, "Service redcell-router: its selector matches no pod template"},
		{"service_target_port", func(t *testing.T, m *k8sManifests) {
			m.services["redcell-db-2"].Spec.Ports[0].TargetPort = intstr.FromString("mariadb")
		}, `Service redcell-db-2 port mysql: target port "mariadb"/TCP is not a container port of StatefulSet redcell-db-2`},
		{"secret_item_key", func(t *testing.T, m *k8sManifests) {
			items := volumeNamed(t, m, "StatefulSet", "redcell-cell-2", "secrets").Secret.Items
			items[slices.IndexFunc(items, func(it corev1.KeyToPath) bool { return it.Key == "db_password" })].Key = "db_pasword"
		}, `volume secrets: Secret redcell-secrets has no key "db_pasword"`},
		{"configmap_name", func(t *testing.T, m *k8sManifests) {
			volumeNamed(t, m, "Deployment", "redcell-router", "config").ConfigMap.Name = "redcell"
		}, "volume config: no ConfigMap redcell"},
		{"probe_port", func(t *testing.T, m *k8sManifests) {
			podOf(t, m, "Deployment", "redcell-router").Containers[0].ReadinessProbe.HTTPGet.Port = intstr.FromString("htp")
		}, `readinessProbe: port "htp" is not a port of the container`},
		{"pdb_selector", func(t *testing.T, m *k8sManifests) {
			i := slices.IndexFunc(m.pdbs, func(p *policyv1.PodDisruptionBudget) bool { return p.Name == "redcell-cells" })
			m.pdbs[i].Spec.Selector.MatchLabels["app.kubernetes.io/component"] = "cells"
		}, "PodDisruptionBudget redcell-cells: its selector matches no pod template"},
		{"headless", func(t *testing.T, m *k8sManifests) {
			m.services["redcell-gossip"].Spec.ClusterIP = ""
		}, "serviceName redcell-gossip is not a headless Service"},
		{"env_ref", func(t *testing.T, m *k8sManifests) {
			e := envNamed(t, m, "Deployment", "redcell-router", "REDCELL_ADVERTISE_HOST")
			e.Value, e.ValueFrom = "$(POD_IP)", nil
		}, "REDCELL_ADVERTISE_HOST refers to $(POD_IP), which is not set before it"},
		{"shell_in_image", func(t *testing.T, m *k8sManifests) {
			c := &podOf(t, m, "Deployment", "redcell-router").Containers[0]
			c.Lifecycle.PreStop = &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "sleep 10"}}}
		}, `preStop: exec "sh": the redcell image holds /usr/local/bin/redcell and nothing else (no shell)`},
		{"secret_mode", func(t *testing.T, m *k8sManifests) {
			mode := int32(440) // defaultMode: 440 in YAML, which is 0o670
			volumeNamed(t, m, "Deployment", "redcell-router", "secrets").Secret.DefaultMode = &mode
		}, "volume secrets: mode 0670 with fsGroup true: want the secret files read-only, readable by the pod's fsGroup and nobody else"},
		{"db_stops_first", func(t *testing.T, m *k8sManifests) {
			podOf(t, m, "StatefulSet", "redcell-db-3").Containers[0].Lifecycle = nil
		}, "StatefulSet redcell-db-3: preStop sleeps 0s, less than a cell's grace period"},
	}
	// refuses decodes the manifests afresh, lets mutate break them, and wants
	// a problem of check that names want.
	refuses := func(t *testing.T, mutate func(*testing.T, *k8sManifests), check func(*k8sManifests) []string, want string) {
		t.Helper()
		m, err := decodeK8s(files)
		if err != nil {
			t.Fatal(err)
		}
		mutate(t, m)
		problems := check(m)
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, want) }) {
			t.Errorf("want a problem with %q, got %q", want, problems)
		}
	}
	for _, c := range refFails {
		t.Run("refuses_"+c.name, func(t *testing.T) {
			refuses(t, c.mutate, func(m *k8sManifests) []string { return append(checkK8sRefs(m), checkK8sLayout(m, compose)...) }, c.want)
		})
	}

	// The config checks find a config the processes would refuse, one that
	// names what the manifests do not declare, or an address announced that
	// the others could not reach.
	configFails := []struct {
		name   string
		mutate func(t *testing.T, m *k8sManifests)
		want   string
	}{
		{"dsn_host", configEdit("redcell-db-2:3306", "mariadb-2:3306"), `cell-2: dsn: "mariadb-2:3306" is no Service`},
		{"memcached_port", configEdit("redcell-memcached:11211", "redcell-memcached:11212"), `memcached: "redcell-memcached:11212": Service redcell-memcached has no port 11212`},
		{"unknown_key", configEdit("gossip_seeds:", "gossip_seed:"), "field gossip_seed not found"},
		// Announced as the pod's IP still, but bound to the loopback only.
		{"listen", configEdit(`listen: "0.0.0.0:9101"`, `listen: "127.0.0.1:9101"`), "cell-1: listen 127.0.0.1:9101 does not bind every address of the pod at its http port"},
		{"cell_no_advertise_host", func(t *testing.T, m *k8sManifests) {
			c := &podOf(t, m, "StatefulSet", "redcell-cell-1").Containers[0]
			c.Env = slices.DeleteFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "REDCELL_ADVERTISE_HOST" })
		}, `cell-1: redcell refuses the config: config: cell cell-1 listen "0.0.0.0:9101" listens on every address`},
		{"router_no_advertise_host", func(t *testing.T, m *k8sManifests) {
			c := &podOf(t, m, "Deployment", "redcell-router").Containers[0]
			c.Env = slices.DeleteFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "REDCELL_ADVERTISE_HOST" })
		}, `router gossip "0.0.0.0:7946" listens on every address`},
		{"advertise_node_ip", func(t *testing.T, m *k8sManifests) {
			envNamed(t, m, "StatefulSet", "redcell-cell-3", "REDCELL_ADVERTISE_HOST").ValueFrom.FieldRef.FieldPath = "status.hostIP"
		}, "cell-3 announces listen " + k8sNodeIP + ":9101, not the pod's IP 10.244.3.7 and its http port 9101"},
		// A headless Service gives the pods' own IPs, which a process dials
		// at the seed's port: a cell gossiping on another port is never
		// joined through the seeds, though it is consistent in itself.
		{"gossip_port", func(t *testing.T, m *k8sManifests) {
			c := &podOf(t, m, "StatefulSet", "redcell-cell-2").Containers[0]
			for i := range c.Ports {
				if strings.HasPrefix(c.Ports[i].Name, "gossip-") {
					c.Ports[i].ContainerPort = 7947
				}
			}
			cm := m.configMaps["redcell-config"]
			before, after, ok := strings.Cut(cm.Data["redcell.yaml"], "- name: cell-2\n")
			if !ok || !strings.Contains(after, `gossip: "0.0.0.0:7946"`) {
				t.Fatal("redcell.yaml has no cell-2 gossiping on 0.0.0.0:7946")
			}
			cm.Data["redcell.yaml"] = before + "- name: cell-2\n" + strings.Replace(after, `gossip: "0.0.0.0:7946"`, `gossip: "0.0.0.0:7947"`, 1)
		}, "gossip seed redcell-gossip:7946: StatefulSet redcell-cell-2 gossips on port 7947"},
	}
	for _, c := range configFails {
		t.Run("refuses_config_"+c.name, func(t *testing.T) {
			refuses(t, c.mutate, func(m *k8sManifests) []string { return checkK8sConfig(t, m, bin, compose) }, c.want)
		})
	}
}

// configEdit returns a mutation that replaces the first old in the
// ConfigMap's cluster config by new.
func configEdit(old, new string) func(t *testing.T, m *k8sManifests) {
	return func(t *testing.T, m *k8sManifests) {
		t.Helper()
		cm := m.configMaps["redcell-config"]
		if !strings.Contains(cm.Data["redcell.yaml"], old) {
			t.Fatalf("redcell.yaml has no %q", old)
		}
		cm.Data["redcell.yaml"] = strings.Replace(cm.Data["redcell.yaml"], old, new, 1)
	}
}

// ---- Decoding ----

// kustomization is the part of kustomize's Kustomization that deploy/k8s
// uses; decoded strictly like the rest, so a field it does not list is an
// error: add it here when kustomization.yaml needs it.
type kustomization struct {
	APIVersion      string   `json:"apiVersion"`
	Kind            string   `json:"kind"`
	Namespace       string   `json:"namespace,omitempty"`
	Resources       []string `json:"resources,omitempty"`
	SecretGenerator []struct {
		Name  string   `json:"name"`
		Type  string   `json:"type,omitempty"`
		Files []string `json:"files,omitempty"`
	} `json:"secretGenerator,omitempty"`
	GeneratorOptions struct {
		DisableNameSuffixHash bool `json:"disableNameSuffixHash,omitempty"`
	} `json:"generatorOptions"`
	Images []kustomizeImage `json:"images,omitempty"`
}

type kustomizeImage struct {
	Name    string `json:"name"`
	NewName string `json:"newName,omitempty"`
	NewTag  string `json:"newTag,omitempty"`
}

// k8sKinds are the kinds deploy/k8s may hold, by "apiVersion kind", each
// with the Go type its documents decode into.
var k8sKinds = map[string]func() any{
	"v1 ConfigMap":                  func() any { return new(corev1.ConfigMap) },
	"v1 Secret":                     func() any { return new(corev1.Secret) },
	"v1 Service":                    func() any { return new(corev1.Service) },
	"apps/v1 Deployment":            func() any { return new(appsv1.Deployment) },
	"apps/v1 StatefulSet":           func() any { return new(appsv1.StatefulSet) },
	"policy/v1 PodDisruptionBudget": func() any { return new(policyv1.PodDisruptionBudget) },
	"kustomize.config.k8s.io/v1beta1 Kustomization": func() any { return new(kustomization) },
}

// k8sManifests is deploy/k8s decoded.
type k8sManifests struct {
	kust         *kustomization
	files        []string // the manifest files (kustomization.yaml aside), relative to k8sDir
	configMaps   map[string]*corev1.ConfigMap
	secrets      map[string]map[string]bool // by name: its keys (the Secrets kustomize generates included)
	services     map[string]*corev1.Service
	deployments  []*appsv1.Deployment
	statefulSets []*appsv1.StatefulSet
	pdbs         []*policyv1.PodDisruptionBudget
	metas        []k8sMeta // every object's kind and metadata, in file order
}

type k8sMeta struct {
	where string // file#document
	kind  string
	meta  *metav1.ObjectMeta
}

// readK8sFiles returns the YAML files under k8sDir (not secrets.sh's
// directory), by path relative to it.
func readK8sFiles(t *testing.T) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(k8sDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(k8sDir, p)
		if d.IsDir() {
			if rel == k8sSecretsDir {
				return filepath.SkipDir
			}
			return nil
		}
		if ext := filepath.Ext(p); ext != ".yaml" && ext != ".yml" {
			return nil
		}
		b, err := os.ReadFile(p)
		out[filepath.ToSlash(rel)] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("no YAML files under %s", k8sDir)
	}
	return out
}

// mutateFile returns a copy of files with old replaced by new in name.
func mutateFile(t *testing.T, files map[string][]byte, name, old, new string) map[string][]byte {
	t.Helper()
	out := maps.Clone(files)
	if !bytes.Contains(files[name], []byte(old)) {
		t.Fatalf("%s has no %q", name, old)
	}
	out[name] = bytes.Replace(files[name], []byte(old), []byte(new), 1)
	return out
}

// decodeK8s decodes every document of files (see decodeK8sDoc) and files
// the objects by kind; the kustomization's generated Secrets are added with
// their keys. An object named twice is an error.
func decodeK8s(files map[string][]byte) (*k8sManifests, error) {
	m := &k8sManifests{configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]map[string]bool{}, services: map[string]*corev1.Service{}}
	var errs []error
	seen := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if name != "kustomization.yaml" {
			m.files = append(m.files, name)
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(files[name])))
		for i := 1; ; i++ {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			where := fmt.Sprintf("%s#%d", name, i)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", where, err))
				break
			}
			obj, err := decodeK8sDoc(doc)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", where, err))
				continue
			}
			if obj == nil {
				continue // comments only
			}
			var meta *metav1.ObjectMeta
			kind := ""
			switch o := obj.(type) {
			case *kustomization:
				if m.kust != nil || name != "kustomization.yaml" {
					errs = append(errs, fmt.Errorf("%s: a Kustomization belongs in kustomization.yaml, once", where))
				}
				m.kust = o
				continue
			case *corev1.ConfigMap:
				m.configMaps[o.Name], meta, kind = o, &o.ObjectMeta, "ConfigMap"
			case *corev1.Secret:
				keys := map[string]bool{}
				for k := range o.Data {
					keys[k] = true
				}
				for k := range o.StringData {
					keys[k] = true
				}
				m.secrets[o.Name], meta, kind = keys, &o.ObjectMeta, "Secret"
			case *corev1.Service:
				m.services[o.Name], meta, kind = o, &o.ObjectMeta, "Service"
			case *appsv1.Deployment:
				m.deployments, meta, kind = append(m.deployments, o), &o.ObjectMeta, "Deployment"
			case *appsv1.StatefulSet:
				m.statefulSets, meta, kind = append(m.statefulSets, o), &o.ObjectMeta, "StatefulSet"
			case *policyv1.PodDisruptionBudget:
				m.pdbs, meta, kind = append(m.pdbs, o), &o.ObjectMeta, "PodDisruptionBudget"
			}
			if prev, ok := seen[kind+"/"+meta.Name]; ok {
				errs = append(errs, fmt.Errorf("%s: %s %s is defined in %s already", where, kind, meta.Name, prev))
			}
			seen[kind+"/"+meta.Name] = where
			m.metas = append(m.metas, k8sMeta{where: where, kind: kind, meta: meta})
		}
	}
	if m.kust == nil {
		errs = append(errs, errors.New("no kustomization.yaml"))
	} else {
		for _, g := range m.kust.SecretGenerator {
			keys := map[string]bool{}
			for _, f := range g.Files {
				k, _, ok := strings.Cut(f, "=")
				if !ok {
					k = path.Base(f)
				}
				keys[k] = true
			}
			if _, ok := m.secrets[g.Name]; ok {
				errs = append(errs, fmt.Errorf("kustomization.yaml: Secret %s is generated and defined", g.Name))
			}
			m.secrets[g.Name] = keys
		}
	}
	return m, errors.Join(errs...)
}

// decodeK8sDoc decodes one YAML document strictly into the Go type of its
// apiVersion and kind (k8sKinds): YAML to JSON refusing duplicate keys, then
// encoding/json refusing unknown fields (sigs.k8s.io/yaml.UnmarshalStrict),
// as the API server's strict field validation does. A document of comments
// only is nil.
func decodeK8sDoc(doc []byte) (any, error) {
	j, err := sigsyaml.YAMLToJSON(doc)
	if err != nil {
		return nil, err
	}
	if s := string(bytes.TrimSpace(j)); s == "null" || s == "" {
		return nil, nil
	}
	var tm metav1.TypeMeta
	if err := json.Unmarshal(j, &tm); err != nil {
		return nil, err
	}
	newObj, ok := k8sKinds[tm.APIVersion+" "+tm.Kind]
	if !ok {
		return nil, fmt.Errorf("%s %s: a kind deploy/k8s does not use (k8sKinds lists them)", tm.APIVersion, tm.Kind)
	}
	obj := newObj()
	if err := sigsyaml.UnmarshalStrict(doc, obj); err != nil {
		return nil, fmt.Errorf("%s %s: %w", tm.APIVersion, tm.Kind, err)
	}
	return obj, nil
}

// ---- Workloads ----

// k8sWorkload is a Deployment or a StatefulSet: what makes pods.
type k8sWorkload struct {
	kind, name string
	replicas   int32
	selector   *metav1.LabelSelector
	template   *corev1.PodTemplateSpec
	claims     []string // a StatefulSet's volumeClaimTemplates
}

func (w k8sWorkload) String() string { return w.kind + " " + w.name }

func (m *k8sManifests) workloads() []k8sWorkload {
	var out []k8sWorkload
	for _, d := range m.deployments {
		out = append(out, k8sWorkload{kind: "Deployment", name: d.Name, replicas: replicasOf(d.Spec.Replicas),
			selector: d.Spec.Selector, template: &d.Spec.Template})
	}
	for _, s := range m.statefulSets {
		w := k8sWorkload{kind: "StatefulSet", name: s.Name, replicas: replicasOf(s.Spec.Replicas), selector: s.Spec.Selector, template: &s.Spec.Template}
		for _, c := range s.Spec.VolumeClaimTemplates {
			w.claims = append(w.claims, c.Name)
		}
		out = append(out, w)
	}
	return out
}

func replicasOf(r *int32) int32 {
	if r == nil {
		return 1 // the API's default
	}
	return *r
}

// configMapData returns the value of key in ConfigMap name.
func (m *k8sManifests) configMapData(name, key string) (string, bool) {
	cm, ok := m.configMaps[name]
	if !ok {
		return "", false
	}
	v, ok := cm.Data[key]
	return v, ok
}

// podOf returns the pod spec of the workload kind/name.
func podOf(t *testing.T, m *k8sManifests, kind, name string) *corev1.PodSpec {
	t.Helper()
	for _, w := range m.workloads() {
		if w.kind == kind && w.name == name {
			return &w.template.Spec
		}
	}
	t.Fatalf("no %s %s", kind, name)
	return nil
}

// volumeNamed returns the volume called volume of the workload kind/name.
func volumeNamed(t *testing.T, m *k8sManifests, kind, name, volume string) *corev1.Volume {
	t.Helper()
	spec := podOf(t, m, kind, name)
	i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == volume })
	if i < 0 {
		t.Fatalf("%s %s has no volume %s", kind, name, volume)
	}
	return &spec.Volumes[i]
}

// envNamed returns the env variable called name of the first container of
// the workload kind/name.
func envNamed(t *testing.T, m *k8sManifests, kind, name, env string) *corev1.EnvVar {
	t.Helper()
	c := &podOf(t, m, kind, name).Containers[0]
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == env })
	if i < 0 {
		t.Fatalf("%s %s has no env %s", kind, name, env)
	}
	return &c.Env[i]
}

// selected returns the workloads whose pod template's labels sel matches.
func (m *k8sManifests) selected(sel labels.Selector) []k8sWorkload {
	var out []k8sWorkload
	for _, w := range m.workloads() {
		if sel.Matches(labels.Set(w.template.Labels)) {
			out = append(out, w)
		}
	}
	return out
}

// isRedcell says whether c runs the redcell image (no shell, one program).
func isRedcell(c corev1.Container) bool {
	name, _, _ := strings.Cut(c.Image, ":")
	return name == redcellImageName
}

// ---- Cross-references ----

// checkK8sRefs checks what Kubernetes resolves only when it runs the
// objects, and returns the problems.
func checkK8sRefs(m *k8sManifests) []string {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	if m.kust != nil {
		if got := slices.Sorted(slices.Values(m.kust.Resources)); !slices.Equal(got, m.files) {
			add("kustomization.yaml lists resources %v, want every manifest file %v", got, m.files)
		}
		if m.kust.Namespace == "" {
			add("kustomization.yaml sets no namespace")
		}
		if len(m.kust.SecretGenerator) > 0 && !m.kust.GeneratorOptions.DisableNameSuffixHash {
			// A new API key updates the Secret in place, and the routers
			// read it from their mounted file; under a new hashed name
			// every pod would be replaced instead.
			add("kustomization.yaml: generated Secrets get a hash suffix (generatorOptions.disableNameSuffixHash)")
		}
	}
	for _, o := range m.metas {
		if m.kust != nil && o.meta.Namespace != "" && o.meta.Namespace != m.kust.Namespace {
			add("%s: %s %s is in namespace %q, not the kustomization's", o.where, o.kind, o.meta.Name, o.meta.Namespace)
		}
		nameErrs := validation.IsDNS1123Subdomain(o.meta.Name)
		if o.kind == "Service" {
			nameErrs = validation.IsDNS1035Label(o.meta.Name)
		}
		for _, e := range nameErrs {
			add("%s: %s name %q: %s", o.where, o.kind, o.meta.Name, e)
		}
		problems = append(problems, checkLabels(o.where, o.meta.Labels)...)
	}

	workloads := m.workloads()
	for _, w := range workloads {
		sel, err := metav1.LabelSelectorAsSelector(w.selector)
		switch {
		case err != nil:
			add("%s: selector: %v", w, err)
		case w.selector == nil || sel.Empty():
			add("%s: empty selector", w)
		case !sel.Matches(labels.Set(w.template.Labels)):
			add("%s: its selector %s does not match its pod template's labels %v", w, sel, w.template.Labels)
		}
		problems = append(problems, checkLabels(w.String()+" pod template", w.template.Labels)...)
		problems = append(problems, checkPodSpec(m, w)...)
	}
	for _, s := range m.statefulSets {
		if svc, ok := m.services[s.Spec.ServiceName]; !ok || svc.Spec.ClusterIP != corev1.ClusterIPNone {
			add("StatefulSet %s: serviceName %s is not a headless Service of the manifests", s.Name, s.Spec.ServiceName)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(m.services)) {
		svc := m.services[name]
		if len(svc.Spec.Selector) == 0 {
			add("Service %s: no selector", name)
			continue
		}
		behind := m.selected(labels.SelectorFromSet(svc.Spec.Selector))
		if len(behind) == 0 {
			add("Service %s: its selector matches no pod template: %v", name, svc.Spec.Selector)
		}
		for _, p := range svc.Spec.Ports {
			target := p.TargetPort
			if target.Type == intstr.Int && target.IntVal == 0 {
				target = intstr.FromInt32(p.Port)
			}
			for _, w := range behind {
				if !slices.ContainsFunc(w.template.Spec.Containers, func(c corev1.Container) bool {
					_, ok := resolvePort(c, target, p.Protocol)
					return ok
				}) {
					add("Service %s port %s: target port %q/%s is not a container port of %s", name, p.Name, target.String(), protocolOf(p.Protocol), w)
				}
			}
		}
	}
	for _, pdb := range m.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || pdb.Spec.Selector == nil || sel.Empty() {
			add("PodDisruptionBudget %s: no usable selector (%v)", pdb.Name, err)
			continue
		}
		if len(m.selected(sel)) == 0 {
			add("PodDisruptionBudget %s: its selector matches no pod template: %s", pdb.Name, sel)
		}
		if (pdb.Spec.MinAvailable == nil) == (pdb.Spec.MaxUnavailable == nil) {
			add("PodDisruptionBudget %s: set one of minAvailable and maxUnavailable", pdb.Name)
		}
	}
	return problems
}

func checkLabels(where string, l map[string]string) []string {
	var problems []string
	for k, v := range l {
		for _, e := range validation.IsQualifiedName(k) {
			problems = append(problems, fmt.Sprintf("%s: label key %q: %s", where, k, e))
		}
		for _, e := range validation.IsValidLabelValue(v) {
			problems = append(problems, fmt.Sprintf("%s: label %s=%q: %s", where, k, v, e))
		}
	}
	return problems
}

var varRef = regexp.MustCompile(`\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)`)

// checkPodSpec checks a pod template's volumes, mounts, env and ports.
func checkPodSpec(m *k8sManifests, w k8sWorkload) []string {
	var problems []string
	spec := &w.template.Spec
	add := func(format string, args ...any) {
		problems = append(problems, w.String()+": "+fmt.Sprintf(format, args...))
	}

	volumes := map[string]bool{}
	for _, v := range spec.Volumes {
		if volumes[v.Name] {
			add("volume %s twice", v.Name)
		}
		volumes[v.Name] = true
		switch {
		case v.Secret != nil:
			keys, ok := m.secrets[v.Secret.SecretName]
			if !ok {
				add("volume %s: no Secret %s", v.Name, v.Secret.SecretName)
			}
			for _, it := range v.Secret.Items {
				if ok && !keys[it.Key] {
					add("volume %s: Secret %s has no key %q", v.Name, v.Secret.SecretName, it.Key)
				}
			}
			// Read-only, readable by the process through the pod's
			// fsGroup, by no other user (a mode written 440, not 0440,
			// would be 0o670).
			mode := int32(corev1.SecretVolumeSourceDefaultMode)
			if v.Secret.DefaultMode != nil {
				mode = *v.Secret.DefaultMode
			}
			sc := spec.SecurityContext
			if mode&0o337 != 0 || mode&0o040 == 0 || sc == nil || sc.FSGroup == nil {
				add("volume %s: mode %#o with fsGroup %v: want the secret files read-only, readable by the pod's fsGroup and nobody else", v.Name, mode, sc != nil && sc.FSGroup != nil)
			}
		case v.ConfigMap != nil:
			cm, ok := m.configMaps[v.ConfigMap.Name]
			if !ok {
				add("volume %s: no ConfigMap %s", v.Name, v.ConfigMap.Name)
				continue
			}
			for _, it := range v.ConfigMap.Items {
				if _, has := cm.Data[it.Key]; !has {
					add("volume %s: ConfigMap %s has no key %q", v.Name, v.ConfigMap.Name, it.Key)
				}
			}
		}
	}
	for _, c := range w.claims {
		if volumes[c] {
			add("volume claim template %s is also a volume", c)
		}
		volumes[c] = true
	}

	all := append(slices.Clone(spec.InitContainers), spec.Containers...)
	for _, c := range all {
		where := "container " + c.Name
		for _, e := range validation.IsDNS1123Label(c.Name) {
			add("%s: name: %s", where, e)
		}
		portNames := map[string]bool{}
		for _, p := range c.Ports {
			if p.Name == "" {
				continue
			}
			for _, e := range validation.IsValidPortName(p.Name) {
				add("%s: port name %q: %s", where, p.Name, e)
			}
			if portNames[p.Name] {
				add("%s: port name %q twice", where, p.Name)
			}
			portNames[p.Name] = true
		}
		for _, vm := range c.VolumeMounts {
			if !volumes[vm.Name] {
				add("%s: mounts %s, which is no volume of the pod", where, vm.Name)
			}
			if vm.SubPath != "" {
				add("%s: mounts %s with a subPath, which never sees an update of its Secret or ConfigMap", where, vm.Name)
			}
		}
		defined := map[string]bool{}
		for _, e := range c.Env {
			for _, msg := range validation.IsEnvVarName(e.Name) {
				add("%s: env %s: %s", where, e.Name, msg)
			}
			for _, ref := range undefinedRefs(e.Value, defined) {
				add("%s: env %s refers to $(%s), which is not set before it", where, e.Name, ref)
			}
			if f := e.ValueFrom; f != nil {
				switch {
				case f.SecretKeyRef != nil:
					if keys, ok := m.secrets[f.SecretKeyRef.Name]; !ok || !keys[f.SecretKeyRef.Key] {
						add("%s: env %s: no key %q in a Secret %s", where, e.Name, f.SecretKeyRef.Key, f.SecretKeyRef.Name)
					}
				case f.ConfigMapKeyRef != nil:
					if _, has := m.configMapData(f.ConfigMapKeyRef.Name, f.ConfigMapKeyRef.Key); !has {
						add("%s: env %s: no key %q in a ConfigMap %s", where, e.Name, f.ConfigMapKeyRef.Key, f.ConfigMapKeyRef.Name)
					}
				case f.FieldRef != nil:
					if !slices.Contains([]string{"metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName",
						"spec.serviceAccountName", "status.hostIP", "status.podIP"}, f.FieldRef.FieldPath) {
						add("%s: env %s: field %s is not one the downward API gives env", where, e.Name, f.FieldRef.FieldPath)
					}
				}
			}
			defined[e.Name] = true
		}
		for _, ef := range c.EnvFrom {
			if ef.SecretRef != nil && m.secrets[ef.SecretRef.Name] == nil {
				add("%s: envFrom: no Secret %s", where, ef.SecretRef.Name)
			}
			if ef.ConfigMapRef != nil && m.configMaps[ef.ConfigMapRef.Name] == nil {
				add("%s: envFrom: no ConfigMap %s", where, ef.ConfigMapRef.Name)
			}
		}
		for _, a := range append(slices.Clone(c.Command), c.Args...) {
			for _, ref := range undefinedRefs(a, defined) {
				add("%s: command or args refer to $(%s), which is not in its env", where, ref)
			}
		}
		probes := map[string]*corev1.Probe{"readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe, "startupProbe": c.StartupProbe}
		for _, name := range slices.Sorted(maps.Keys(probes)) {
			if p := probes[name]; p != nil {
				for _, msg := range checkHandler(c, &corev1.LifecycleHandler{Exec: p.Exec, HTTPGet: p.HTTPGet, TCPSocket: p.TCPSocket}, p.GRPC) {
					add("%s: %s: %s", where, name, msg)
				}
			}
		}
		if preStopSleep(c) > gracePeriod(spec) {
			add("%s: preStop sleeps %s, longer than the grace period %s", where, preStopSleep(c), gracePeriod(spec))
		}
		if c.Lifecycle != nil {
			for name, h := range map[string]*corev1.LifecycleHandler{"preStop": c.Lifecycle.PreStop, "postStart": c.Lifecycle.PostStart} {
				if h != nil {
					for _, msg := range checkHandler(c, h, nil) {
						add("%s: %s: %s", where, name, msg)
					}
				}
			}
		}
	}
	return problems
}

// undefinedRefs returns the $(VAR) references in s to variables not in
// defined ($$ escapes a $, as in Kubernetes).
func undefinedRefs(s string, defined map[string]bool) []string {
	var out []string
	for _, m := range varRef.FindAllStringSubmatch(s, -1) {
		if m[1] != "" && !defined[m[1]] {
			out = append(out, m[1])
		}
	}
	return out
}

// checkHandler checks a probe's or hook's one action: its port is one the
// container declares, and an exec in the redcell image runs redcell, the
// one program there (no shell: distroless).
func checkHandler(c corev1.Container, h *corev1.LifecycleHandler, grpc *corev1.GRPCAction) []string {
	var problems []string
	n := 0
	if h.Exec != nil {
		n++
		if len(h.Exec.Command) == 0 {
			problems = append(problems, "exec without a command")
		} else if isRedcell(c) && h.Exec.Command[0] != redcellBinary {
			problems = append(problems, fmt.Sprintf("exec %q: the redcell image holds %s and nothing else (no shell)", h.Exec.Command[0], redcellBinary))
		}
	}
	port := func(p intstr.IntOrString) {
		if _, ok := resolvePort(c, p, corev1.ProtocolTCP); !ok {
			problems = append(problems, fmt.Sprintf("port %q is not a port of the container", p.String()))
		}
	}
	if h.HTTPGet != nil {
		n++
		port(h.HTTPGet.Port)
		if !strings.HasPrefix(h.HTTPGet.Path, "/") {
			problems = append(problems, fmt.Sprintf("path %q", h.HTTPGet.Path))
		}
	}
	if h.TCPSocket != nil {
		n++
		port(h.TCPSocket.Port)
	}
	if grpc != nil {
		n++
		port(intstr.FromInt32(grpc.Port))
	}
	if h.Sleep != nil {
		n++
		if h.Sleep.Seconds <= 0 {
			problems = append(problems, "sleep of no time")
		}
	}
	if n != 1 {
		problems = append(problems, fmt.Sprintf("%d actions, want one", n))
	}
	return problems
}

func protocolOf(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

// resolvePort finds p (a port name or number) among c's container ports of
// protocol proto, and returns its number.
func resolvePort(c corev1.Container, p intstr.IntOrString, proto corev1.Protocol) (int32, bool) {
	for _, cp := range c.Ports {
		if protocolOf(cp.Protocol) != protocolOf(proto) {
			continue
		}
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

// namedPort is the number of c's port called name (TCP unless proto says).
func namedPort(c corev1.Container, name string, proto corev1.Protocol) (int32, bool) {
	return resolvePort(c, intstr.FromString(name), proto)
}

// ---- The cluster they describe ----

// composeFacts is what the Compose deployment says that the Kubernetes one
// must say too.
type composeFacts struct {
	services map[string]composeService // by service name
	shards   map[string]string         // cell name → its shards, from the Compose cluster config
}

type composeService struct {
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
}

func readCompose(t *testing.T) composeFacts {
	t.Helper()
	var c struct {
		Services map[string]composeService `yaml:"services"`
	}
	var cfg struct {
		Cells []struct {
			Name   string `yaml:"name"`
			Shards string `yaml:"shards"`
		} `yaml:"cells"`
	}
	for f, v := range map[string]any{composeFile: &c, composeConfig: &cfg} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	out := composeFacts{services: c.Services, shards: map[string]string{}}
	for _, cell := range cfg.Cells {
		out.shards[cell.Name] = cell.Shards
	}
	if len(out.shards) == 0 || len(out.services) == 0 {
		t.Fatalf("%s or %s names no cells or services", composeFile, composeConfig)
	}
	return out
}

// k8sRole is what a workload runs, from its first container.
func k8sRole(w k8sWorkload) string {
	c := w.template.Spec.Containers[0]
	switch {
	case isRedcell(c) && len(c.Args) > 0 && (c.Args[0] == "router" || c.Args[0] == "cell"):
		return c.Args[0]
	case strings.HasPrefix(c.Image, "mariadb:"):
		return "database"
	case strings.HasPrefix(c.Image, "memcached:"):
		return "memcached"
	}
	return ""
}

func (m *k8sManifests) byRole(role string) []k8sWorkload {
	var out []k8sWorkload
	for _, w := range m.workloads() {
		if len(w.template.Spec.Containers) > 0 && k8sRole(w) == role {
			out = append(out, w)
		}
	}
	return out
}

// flagValue returns the value after flag in args.
func flagValue(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

func preStopSleep(c corev1.Container) time.Duration {
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		return time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	return 0
}

func gracePeriod(spec *corev1.PodSpec) time.Duration {
	if spec.TerminationGracePeriodSeconds == nil {
		return 30 * time.Second // the API's default
	}
	return time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
}

// checkK8sLayout checks that the manifests run the Compose file's cluster,
// and run it as the processes need, and returns the problems.
func checkK8sLayout(m *k8sManifests, compose composeFacts) []string {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	if m.kust != nil && !slices.ContainsFunc(m.kust.Images, func(i kustomizeImage) bool { return i.Name == redcellImageName }) {
		add("kustomization.yaml has no images entry %q to point the pods at a pushed image", redcellImageName)
	}
	for _, w := range m.workloads() {
		spec := &w.template.Spec
		if len(spec.Containers) == 0 {
			add("%s runs no container", w)
			continue
		}
		role := k8sRole(w)
		if role == "" {
			add("%s runs %s, no part of redcell's cluster", w, spec.Containers[0].Image)
		}
		for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
			if isRedcell(c) && c.Image != redcellImage {
				add("%s: container %s runs %s, want %s (docker build -t %s .; kustomization.yaml's images entry changes it)", w, c.Name, c.Image, redcellImage, redcellImage)
			}
		}
		for _, c := range spec.Containers {
			if c.ReadinessProbe == nil {
				add("%s: container %s has no readiness probe", w, c.Name)
			}
		}
		if role == "router" || role == "cell" {
			// Services named redcell-* would put REDCELL_*_PORT and the like
			// into the env, where the config loader reads REDCELL_ variables.
			if spec.EnableServiceLinks == nil || *spec.EnableServiceLinks {
				add("%s: enableServiceLinks is not false", w)
			}
		}
		if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
			add("%s: mounts a service account token it never uses", w)
		}
	}

	routers, cells, dbs, caches := m.byRole("router"), m.byRole("cell"), m.byRole("database"), m.byRole("memcached")
	if len(routers) != 1 || routers[0].kind != "Deployment" || routers[0].replicas != 2 {
		add("want the routers as one Deployment of 2 replicas, got %v", routers)
	}
	for _, w := range routers {
		c := w.template.Spec.Containers[0]
		if want := []string{"router", "--config", flagValue(c.Args, "--config")}; !slices.Equal(c.Args, want) {
			add("%s runs %v, want %v", w, c.Args, want)
		}
		for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
			// The router serves /healthz only (no /livez).
			if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != api.HealthPath || p.HTTPGet.Port != intstr.FromString("http") {
				add("%s: the %s probe is not GET %s on port http", w, name, api.HealthPath)
			}
		}
		sleep, grace := preStopSleep(c), gracePeriod(&w.template.Spec)
		if sleep < routerPreStopMin {
			add("%s: preStop sleeps %s, want at least %s so that it is out of the Service before it stops", w, sleep, routerPreStopMin)
		}
		if grace < sleep+routerDrainMax {
			add("%s: grace period %s < preStop %s + the router's drain %s", w, grace, sleep, routerDrainMax)
		}
		if !slices.ContainsFunc(slices.Collect(maps.Values(m.services)), func(s *corev1.Service) bool {
			behind := m.selected(labels.SelectorFromSet(s.Spec.Selector))
			return len(behind) == 1 && behind[0].name == w.name && s.Spec.ClusterIP != corev1.ClusterIPNone &&
				slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.TargetPort == intstr.FromString("http") })
		}) {
			add("%s: no Service sends the API to its port http, and to nothing else", w)
		}
	}

	if len(cells) != len(compose.shards) {
		add("%d cell workloads, want the Compose file's %d", len(cells), len(compose.shards))
	}
	var names []string
	cellGraceMax := time.Duration(0)
	for _, w := range cells {
		c := w.template.Spec.Containers[0]
		name := flagValue(c.Args, "--name")
		names = append(names, name)
		if want := []string{"cell", "--config", flagValue(c.Args, "--config"), "--name", name}; !slices.Equal(c.Args, want) {
			add("%s runs %v, want %v", w, c.Args, want)
		}
		if _, ok := compose.shards[name]; !ok {
			add("%s runs cell %q, which the Compose cluster has not", w, name)
		}
		if w.kind != "StatefulSet" || w.replicas != 1 {
			add("%s: a cell is a StatefulSet of one replica (never two processes of one cell), got %d", w, w.replicas)
		}
		want := map[string]string{"readiness": api.HealthPath, "liveness": api.LivePath, "startup": api.LivePath}
		for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe, "startup": c.StartupProbe} {
			if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != want[name] || p.HTTPGet.Port != intstr.FromString("http") {
				add("%s: the %s probe is not GET %s on port http", w, name, want[name])
			}
		}
		sleep, grace := preStopSleep(c), gracePeriod(&w.template.Spec)
		if grace < sleep+cellDrainMax {
			add("%s: grace period %s < preStop %s + the cell's drain %s", w, grace, sleep, cellDrainMax)
		}
		cellGraceMax = max(cellGraceMax, grace)
	}
	if slices.Sort(names); len(slices.Compact(slices.Clone(names))) != len(names) {
		add("cells run under one name twice: %v", names)
	}

	if len(dbs) != len(cells) {
		add("%d MariaDB workloads for %d cells, want one each", len(dbs), len(cells))
	}
	var composeDBs []string
	for name, s := range compose.services {
		if strings.HasPrefix(s.Image, "mariadb:") {
			composeDBs = append(composeDBs, name)
		}
	}
	matched := map[string]string{}
	serverIDs := map[string]string{}
	for _, w := range dbs {
		c := w.template.Spec.Containers[0]
		if w.kind != "StatefulSet" || w.replicas != 1 {
			add("%s: want a StatefulSet of one replica", w)
		}
		i := slices.IndexFunc(composeDBs, func(n string) bool {
			return compose.services[n].Image == c.Image && slices.Equal(compose.services[n].Command, c.Args)
		})
		if i < 0 {
			add("%s runs %s %v, which is no Compose MariaDB's image and command", w, c.Image, c.Args)
		} else if prev, ok := matched[composeDBs[i]]; ok {
			add("%s and %s both run Compose's %s (one server id for two servers)", w, prev, composeDBs[i])
		} else {
			matched[composeDBs[i]] = w.name
		}
		for _, flag := range []string{"--character-set-server=utf8mb4", "--collation-server=utf8mb4_bin", "--binlog-format=ROW", "--log-bin=", "--expire-logs-days=", "--server-id="} {
			if !slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, flag) }) {
				add("%s runs without %s", w, flag)
			}
		}
		if id := flagWithPrefix(c.Args, "--server-id="); id != "" {
			if prev, ok := serverIDs[id]; ok {
				add("%s's server id %s is %s's too", w, id, prev)
			}
			serverIDs[id] = w.name
		}
		if !slices.ContainsFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool {
			return vm.MountPath == "/var/lib/mysql" && slices.Contains(w.claims, vm.Name)
		}) {
			add("%s: /var/lib/mysql is not a volume of its own (a volumeClaimTemplate)", w)
		}
		sleep, grace := preStopSleep(c), gracePeriod(&w.template.Spec)
		if sleep < cellGraceMax {
			add("%s: preStop sleeps %s, less than a cell's grace period %s: stopped together, the database would go first", w, sleep, cellGraceMax)
		}
		if grace < sleep+mariadbStopMin {
			add("%s: grace period %s < preStop %s + %s for a clean shutdown", w, grace, sleep, mariadbStopMin)
		}
	}

	cs, ok := compose.services["memcached"]
	if !ok || len(caches) != 1 || caches[0].kind != "Deployment" || caches[0].replicas != 1 {
		add("want memcached as one Deployment of one replica, got %v", caches)
	} else {
		c := caches[0].template.Spec.Containers[0]
		if c.Image != cs.Image || !slices.Equal(c.Args, cs.Command) {
			add("%s runs %s %v, Compose %s %v", caches[0], c.Image, c.Args, cs.Image, cs.Command)
		}
		for _, d := range m.deployments {
			if d.Name == caches[0].name && d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
				add("%s: a rollout would run two memcached at once (strategy %q, want Recreate)", caches[0], d.Spec.Strategy.Type)
			}
		}
	}

	// The disruption budgets: routers keep one, cells lose one at a time.
	budget := func(ws []k8sWorkload, what string, ok func(*policyv1.PodDisruptionBudget) bool) {
		if len(ws) == 0 {
			return
		}
		if !slices.ContainsFunc(m.pdbs, func(p *policyv1.PodDisruptionBudget) bool {
			sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
			return err == nil && !sel.Empty() && ok(p) && !slices.ContainsFunc(ws, func(w k8sWorkload) bool {
				return !sel.Matches(labels.Set(w.template.Labels))
			})
		}) {
			add("no PodDisruptionBudget covers %s as wanted", what)
		}
	}
	budget(routers, "every router pod, keeping one", func(p *policyv1.PodDisruptionBudget) bool {
		return p.Spec.MinAvailable != nil && p.Spec.MinAvailable.Type == intstr.Int && p.Spec.MinAvailable.IntVal >= 1 && p.Spec.MinAvailable.IntVal < routers[0].replicas
	})
	budget(cells, "every cell pod, one out at a time", func(p *policyv1.PodDisruptionBudget) bool {
		return p.Spec.MaxUnavailable != nil && *p.Spec.MaxUnavailable == intstr.FromInt32(1)
	})
	return problems
}

func flagWithPrefix(args []string, prefix string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, prefix); ok {
			return v
		}
	}
	return ""
}

// checkK8sScripts checks the files around the manifests: secrets.sh writes
// every file the Secret is generated from, and git ignores them.
func checkK8sScripts(t *testing.T, m *k8sManifests) {
	t.Helper()
	script, err := os.ReadFile(filepath.Join(k8sDir, "secrets.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(k8sDir, "secrets.sh")); err != nil || fi.Mode()&0o100 == 0 {
		t.Errorf("secrets.sh is not executable")
	}
	ignore, _ := os.ReadFile(filepath.Join(k8sDir, ".gitignore"))
	if !slices.Contains(strings.Fields(string(ignore)), k8sSecretsDir+"/") {
		t.Errorf("%s/.gitignore does not keep %s/ out of git", k8sDir, k8sSecretsDir)
	}
	for _, g := range m.kust.SecretGenerator {
		for _, f := range g.Files {
			_, p, ok := strings.Cut(f, "=")
			if !ok {
				p = f
			}
			if path.Dir(p) != k8sSecretsDir || !bytes.Contains(script, []byte(path.Base(p))) {
				t.Errorf("Secret %s is made from %s, which secrets.sh does not write under %s/", g.Name, p, k8sSecretsDir)
			}
		}
	}
}

// ---- The cluster config, as each pod loads it ----

// configDumperSource is added to cmd/redcell for one build (go build
// -overlay, nothing on disk changes): `redcell deploytest-k8s-config
// router|cell=NAME FILE` prints as JSON what redcell's own loader and
// validators make of FILE with the process's environment, as `redcell
// router` or `redcell cell --name NAME` loads it, and the addresses it would
// announce (advertised, cellAdvertise: the calls of runRouter and runCell),
// and exits. The loader is package main's, which no other package can
// import.
const configDumperSource = `package main

import (
	"encoding/json"
	"os"
	"strings"
)

type deploytestCell struct {
	Name, Listen, Gossip, AdminListen, DSN, Shards string
	Memcached                                      []string
	AnnounceHTTP, AnnounceGossip                   string // the cell loaded only
}

type deploytestRouter struct{ Listen, AdminListen, Gossip, AnnounceGossip, APIKeys string }

func init() {
	if len(os.Args) != 4 || os.Args[1] != "deploytest-k8s-config" {
		return
	}
	var out struct {
		Error                                  string
		GossipSeeds, Memcached                 []string
		ClusterSecret, AdminToken, IdentityKey string
		Router                                 *deploytestRouter
		Cell                                   *deploytestCell
		Cells                                  []deploytestCell
	}
	fail := func(err error) bool {
		if err != nil && out.Error == "" {
			out.Error = err.Error()
		}
		return err != nil
	}
	role, path := os.Args[2], os.Args[3]
	if fc, err := loadConfig(path); !fail(err) {
		out.GossipSeeds, out.Memcached = fc.GossipSeeds, fc.Memcached
		out.ClusterSecret, out.AdminToken, out.IdentityKey = fc.ClusterSecret, fc.AdminToken, fc.IdentityKey
		for _, c := range fc.Cells {
			out.Cells = append(out.Cells, deploytestCell{Name: c.Name, Listen: c.Listen, Gossip: c.Gossip, AdminListen: c.AdminListen, DSN: c.DSN, Shards: c.Shards})
		}
		if name, ok := strings.CutPrefix(role, "cell="); ok {
			cc, gossip, err := fc.cellConfig(name)
			if !fail(err) {
				out.Cell = &deploytestCell{Name: cc.Name, Listen: cc.Listen, Gossip: gossip, AdminListen: cc.AdminListen,
					DSN: cc.DSN, Shards: cc.Shards.String(), Memcached: cc.Memcached}
				out.Cell.AnnounceHTTP, out.Cell.AnnounceGossip, err = fc.cellAdvertise(cc.Name, cc.Listen, gossip)
				fail(err) // cellConfig validated the whole cell config, its breakers included
			}
		} else {
			rc, err := fc.routerConfig()
			fail(err)
			keys, err := fc.apiKeysPath()
			fail(err)
			_, err = fc.probeConfig()
			fail(err)
			gossip := fc.Router.Gossip
			if gossip == "" {
				gossip = "127.0.0.1:7946" // runRouter's default
			}
			announce, err := advertised(gossip, fc.Router.AdvertiseHost, "router gossip")
			fail(err)
			out.Router = &deploytestRouter{rc.Listen, rc.AdminListen, gossip, announce, keys}
		}
	}
	_ = json.NewEncoder(os.Stdout).Encode(out)
	os.Exit(0)
}
`

// configDump is configDumperSource's output.
type configDump struct {
	Error                                  string
	GossipSeeds, Memcached                 []string
	ClusterSecret, AdminToken, IdentityKey string
	Router                                 *struct{ Listen, AdminListen, Gossip, AnnounceGossip, APIKeys string }
	Cell                                   *dumpCell
	Cells                                  []dumpCell
}

type dumpCell struct {
	Name, Listen, Gossip, AdminListen, DSN, Shards string
	Memcached                                      []string
	AnnounceHTTP, AnnounceGossip                   string
}

// buildConfigDumper builds redcell with configDumperSource added.
func buildConfigDumper(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	root, err := filepath.Abs(moduleRoot)
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "dump.go")
	overlay, _ := json.Marshal(map[string]map[string]string{
		"Replace": {filepath.Join(root, "cmd", "redcell", "zz_deploytest_k8s_config.go"): src}})
	for f, b := range map[string][]byte{src: []byte(configDumperSource), filepath.Join(dir, "overlay.json"): overlay} {
		if err := os.WriteFile(f, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "redcell")
	build := exec.Command("go", "build", "-overlay", filepath.Join(dir, "overlay.json"), "-o", bin, "./cmd/redcell")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/redcell with the config dumper: %v\n%s", err, out)
	}
	return bin
}

// fakeSecret is the test's content of the generated Secret's key.
func fakeSecret(key string) string {
	if key == "api_keys" {
		return "keys: []\n"
	}
	return "k8s-test-" + key + "-0123456789abcdef"
}

// k8sNodeIP is the made-up IP of every pod's node (the downward API's
// status.hostIP); each pod's own IP is another.
const k8sNodeIP = "192.168.50.1"

// k8sPod is one pod of a workload as its containers would see it: each
// volume a directory (a Secret's keys as fakeSecret, a ConfigMap's data, an
// emptyDir or a claim empty), the pod's IP made up.
type k8sPod struct {
	w    k8sWorkload
	ip   string
	m    *k8sManifests
	dirs map[string]string // volume name → its directory
}

func newK8sPod(t *testing.T, m *k8sManifests, w k8sWorkload, ip string) *k8sPod {
	t.Helper()
	p := &k8sPod{w: w, ip: ip, m: m, dirs: map[string]string{}}
	root := t.TempDir()
	write := func(vol, rel, content string) {
		f := filepath.Join(p.dirs[vol], filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	names := slices.Clone(w.claims)
	for _, v := range w.template.Spec.Volumes {
		names = append(names, v.Name)
	}
	for i, name := range names {
		p.dirs[name] = filepath.Join(root, strconv.Itoa(i))
		if err := os.Mkdir(p.dirs[name], 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range w.template.Spec.Volumes {
		switch {
		case v.Secret != nil:
			items := v.Secret.Items
			if len(items) == 0 {
				for k := range m.secrets[v.Secret.SecretName] {
					items = append(items, corev1.KeyToPath{Key: k, Path: k})
				}
			}
			for _, it := range items {
				write(v.Name, it.Path, fakeSecret(it.Key))
			}
		case v.ConfigMap != nil:
			cm := m.configMaps[v.ConfigMap.Name]
			if cm == nil {
				continue
			}
			items := v.ConfigMap.Items
			if len(items) == 0 {
				for k := range cm.Data {
					items = append(items, corev1.KeyToPath{Key: k, Path: k})
				}
			}
			for _, it := range items {
				write(v.Name, it.Path, cm.Data[it.Key])
			}
		}
	}
	return p
}

// mountOf finds the mount of c that holds path (the longest mount path
// that is path or a parent of it).
func mountOf(c corev1.Container, p string) (corev1.VolumeMount, string, bool) {
	var best corev1.VolumeMount
	rest, found := "", false
	for _, vm := range c.VolumeMounts {
		if r, ok := strings.CutPrefix(p, vm.MountPath); ok && (r == "" || r[0] == '/') && len(vm.MountPath) > len(best.MountPath) {
			best, rest, found = vm, strings.TrimPrefix(r, "/"), true
		}
	}
	return best, rest, found
}

// hostPath is where the file at p in container c is in this test.
func (p *k8sPod) hostPath(c corev1.Container, path string) (string, bool) {
	vm, rest, ok := mountOf(c, path)
	if !ok {
		return "", false
	}
	return filepath.Join(p.dirs[vm.Name], vm.SubPath, filepath.FromSlash(rest)), true
}

// secretKeyAt returns the Secret and key whose file is at path in
// container c of w.
func (m *k8sManifests) secretKeyAt(w k8sWorkload, c corev1.Container, path string) (secret, key string, ok bool) {
	vm, rest, ok := mountOf(c, path)
	if !ok {
		return "", "", false
	}
	for _, v := range w.template.Spec.Volumes {
		if v.Name != vm.Name || v.Secret == nil {
			continue
		}
		if len(v.Secret.Items) == 0 {
			return v.Secret.SecretName, rest, m.secrets[v.Secret.SecretName][rest]
		}
		for _, it := range v.Secret.Items {
			if it.Path == rest {
				return v.Secret.SecretName, it.Key, true
			}
		}
	}
	return "", "", false
}

// env returns c's environment as Kubernetes sets it (downward API values,
// $(VAR) expanded), and as the test runs the process: with paths under its
// mounts moved to where they are here.
func (p *k8sPod) env(c corev1.Container) (vars map[string]string, process []string) {
	vars = map[string]string{}
	for _, e := range c.Env {
		v := expandVars(e.Value, vars)
		if f := e.ValueFrom; f != nil {
			switch {
			case f.FieldRef != nil && f.FieldRef.FieldPath == "status.podIP":
				v = p.ip
			case f.FieldRef != nil && f.FieldRef.FieldPath == "status.hostIP":
				v = k8sNodeIP
			case f.FieldRef != nil && f.FieldRef.FieldPath == "metadata.name":
				v = p.w.name + "-0"
			case f.FieldRef != nil && f.FieldRef.FieldPath == "metadata.namespace":
				v = p.m.kust.Namespace
			case f.SecretKeyRef != nil:
				v = fakeSecret(f.SecretKeyRef.Key)
			case f.ConfigMapKeyRef != nil:
				v, _ = p.m.configMapData(f.ConfigMapKeyRef.Name, f.ConfigMapKeyRef.Key)
			}
		}
		vars[e.Name] = v
	}
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		v := vars[k]
		if h, ok := p.hostPath(c, v); ok && strings.HasPrefix(v, "/") {
			v = h
		}
		process = append(process, k+"="+v)
	}
	return vars, process
}

// expandVars expands $(VAR) of vars in s, as Kubernetes does in env values,
// command and args; $$ is a $.
func expandVars(s string, vars map[string]string) string {
	return varRef.ReplaceAllStringFunc(s, func(ref string) string {
		if ref == "$$" {
			return "$"
		}
		if v, ok := vars[ref[2:len(ref)-1]]; ok {
			return v
		}
		return ref
	})
}

// dump runs the config dumper as container c would load its config.
func (p *k8sPod) dump(bin string, c corev1.Container, role string) (configDump, error) {
	var d configDump
	cfg := flagValue(c.Args, "--config")
	file, ok := p.hostPath(c, cfg)
	if !ok {
		return d, fmt.Errorf("--config %s is not in a volume of the container", cfg)
	}
	if _, err := os.Stat(file); err != nil {
		return d, fmt.Errorf("--config %s: %w", cfg, err)
	}
	_, env := p.env(c)
	cmd := exec.Command(bin, "deploytest-k8s-config", role, file)
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return d, fmt.Errorf("the config dumper: %w: %s", err, stderr.Bytes())
	}
	if err := json.Unmarshal(out, &d); err != nil {
		return d, fmt.Errorf("the config dumper: %w: %s", err, out)
	}
	if d.Error != "" {
		return d, fmt.Errorf("redcell refuses the config: %s", d.Error)
	}
	return d, nil
}

// serviceBehind resolves addr (host:port of the config) to the Service of
// the manifests it names (the host its short name, or that qualified by
// the namespace), the port of protocol proto, and the workloads behind it.
func (m *k8sManifests) serviceBehind(addr string, proto corev1.Protocol) (*corev1.Service, []k8sWorkload, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, nil, err
	}
	name, ns, qualified := strings.Cut(host, ".")
	if qualified && m.kust != nil && ns != m.kust.Namespace && !strings.HasPrefix(ns, m.kust.Namespace+".svc") {
		return nil, nil, fmt.Errorf("%q is in another namespace than %s", addr, m.kust.Namespace)
	}
	svc, ok := m.services[name]
	if !ok {
		return nil, nil, fmt.Errorf("%q is no Service of the manifests", addr)
	}
	i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool {
		return int(p.Port) == port && protocolOf(p.Protocol) == protocolOf(proto)
	})
	if i < 0 {
		return nil, nil, fmt.Errorf("%q: Service %s has no port %d/%s", addr, name, port, protocolOf(proto))
	}
	return svc, m.selected(labels.SelectorFromSet(svc.Spec.Selector)), nil
}

// checkK8sConfig loads the cluster config in every router and cell pod (see
// k8sPod.dump) and checks what it names against the manifests: every
// address a process binds is every address of its pod (a pod's IP is known
// only once it runs, and kubectl port-forward dials the loopback), at the
// container's port; what it announces is its pod's IP, at that port.
func checkK8sConfig(t *testing.T, m *k8sManifests, bin string, compose composeFacts) []string {
	t.Helper()
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	routers, cells, dbs := m.byRole("router"), m.byRole("cell"), m.byRole("database")
	if len(routers) == 0 || len(cells) == 0 {
		return []string{"no router or no cell to load the config as"}
	}
	binds := func(who, what, addr string, c corev1.Container, port string) {
		host, p, err := net.SplitHostPort(addr)
		want, ok := namedPort(c, port, corev1.ProtocolTCP)
		ip := net.ParseIP(host)
		if err != nil || !ok || p != strconv.Itoa(int(want)) || !(host == "" || ip != nil && ip.IsUnspecified()) {
			add("%s: %s %s does not bind every address of the pod at its %s port %d", who, what, addr, port, want)
		}
	}
	announces := func(who, what, addr, ip string, c corev1.Container, port string) {
		want, ok := namedPort(c, port, corev1.ProtocolTCP)
		if !ok || addr != net.JoinHostPort(ip, strconv.Itoa(int(want))) {
			add("%s announces %s %s, not the pod's IP %s and its %s port %d", who, what, addr, ip, port, want)
		}
	}
	gossipPorts := func(who string, c corev1.Container) {
		tcp, ok1 := namedPort(c, "gossip-tcp", corev1.ProtocolTCP)
		udp, ok2 := namedPort(c, "gossip-udp", corev1.ProtocolUDP)
		if !ok1 || !ok2 || tcp != udp {
			add("%s: want the gossip port as gossip-tcp and gossip-udp, one number (memberlist uses both)", who)
		}
	}
	secrets := func(who string, d configDump, cell bool) {
		if d.ClusterSecret != fakeSecret("cluster_secret") || d.AdminToken != fakeSecret("admin_token") {
			add("%s reads its cluster secret or admin token from elsewhere than the Secret's files", who)
		}
		if cell && d.IdentityKey != fakeSecret("identity_key") {
			add("%s reads no identity key from the Secret's file", who)
		}
	}
	memcached := func(who string, servers []string) {
		if len(servers) == 0 {
			add("%s: no memcached", who)
		}
		for _, s := range servers {
			svc, behind, err := m.serviceBehind(s, corev1.ProtocolTCP)
			switch {
			case err != nil:
				add("%s: memcached: %v", who, err)
			case svc.Spec.ClusterIP == corev1.ClusterIPNone:
				add("%s: memcached %s is a headless Service: a cell resolves it once, and would keep the address of a pod gone", who, s)
			case len(behind) != 1 || k8sRole(behind[0]) != "memcached":
				add("%s: memcached %s is not the memcached workload (%v)", who, s, behind)
			}
		}
	}

	// The routers: the whole config, as the first to load it.
	r := routers[0]
	rc := r.template.Spec.Containers[0]
	const routerIP = "10.244.0.10"
	rd, err := newK8sPod(t, m, r, routerIP).dump(bin, rc, "router")
	if err != nil {
		return append(problems, fmt.Sprintf("%s: %v", r, err))
	}
	binds("router", "listen", rd.Router.Listen, rc, "http")
	binds("router", "admin_listen", rd.Router.AdminListen, rc, "admin")
	binds("router", "gossip", rd.Router.Gossip, rc, "gossip-tcp")
	announces("router", "gossip", rd.Router.AnnounceGossip, routerIP, rc, "gossip-tcp")
	gossipPorts("router", rc)
	secrets("router", rd, false)
	memcached("router", rd.Memcached)
	if s, k, ok := m.secretKeyAt(r, rc, rd.Router.APIKeys); !ok || k != "api_keys" {
		add("router: api_keys %s is not the Secret's api_keys mounted (got %s %s)", rd.Router.APIKeys, s, k)
	}
	if len(rd.GossipSeeds) == 0 {
		add("no gossip seeds")
	}
	for _, seed := range rd.GossipSeeds {
		svc, behind, err := m.serviceBehind(seed, corev1.ProtocolTCP)
		if err == nil {
			_, _, err = m.serviceBehind(seed, corev1.ProtocolUDP)
		}
		if err != nil {
			add("gossip seed: %v", err)
			continue
		}
		if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses {
			add("gossip seed %s: Service %s must be headless and publish pods not ready (its name must resolve to every member, also while they start)", seed, svc.Name)
		}
		// The Service is headless: its name resolves to the pods' own IPs,
		// and a process dials each at the seed's port, no target port
		// applied. A member gossiping on another port is never reached.
		_, seedPort, _ := net.SplitHostPort(seed)
		for _, w := range append(slices.Clone(routers), cells...) {
			if !slices.ContainsFunc(behind, func(b k8sWorkload) bool { return b.name == w.name && b.kind == w.kind }) {
				add("gossip seed %s does not lead to %s", seed, w)
			}
			if p, _ := namedPort(w.template.Spec.Containers[0], "gossip-tcp", corev1.ProtocolTCP); strconv.Itoa(int(p)) != seedPort {
				add("gossip seed %s: %s gossips on port %d, not the seed's", seed, w, p)
			}
		}
	}
	var ranges []sharding.Cell
	for _, c := range rd.Cells {
		if compose.shards[c.Name] != c.Shards {
			add("%s: shards %q, the Compose cluster's %q", c.Name, c.Shards, compose.shards[c.Name])
		}
		rs, err := sharding.ParseRanges(c.Shards)
		if err != nil {
			add("%s: shards: %v", c.Name, err)
		}
		ranges = append(ranges, sharding.Cell{Name: c.Name, Addr: c.Name, Shards: rs, Version: 1})
	}
	if sm, conflicts := sharding.NewMap(ranges); len(conflicts) > 0 || sm.Uncovered() > 0 {
		add("the cells' shards overlap (%v) or leave %d uncovered", conflicts, sm.Uncovered())
	}
	if len(rd.Cells) != len(compose.shards) {
		add("the config lists %d cells, the Compose cluster %d", len(rd.Cells), len(compose.shards))
	}

	// Each cell, in its own pod.
	dbOf := map[string]string{}
	for i, w := range cells {
		c := w.template.Spec.Containers[0]
		name := flagValue(c.Args, "--name")
		ip := fmt.Sprintf("10.244.%d.7", i+1)
		pod := newK8sPod(t, m, w, ip)
		d, err := pod.dump(bin, c, "cell="+name)
		if err != nil {
			add("%s: %v", name, err)
			continue
		}
		binds(name, "listen", d.Cell.Listen, c, "http")
		binds(name, "gossip", d.Cell.Gossip, c, "gossip-tcp")
		binds(name, "admin_listen", d.Cell.AdminListen, c, "admin")
		announces(name, "listen", d.Cell.AnnounceHTTP, ip, c, "http")
		announces(name, "gossip", d.Cell.AnnounceGossip, ip, c, "gossip-tcp")
		gossipPorts(name, c)
		secrets(name, d, true)
		memcached(name, d.Cell.Memcached)
		if d.Cell.Shards != compose.shards[name] {
			add("%s: shards %q, the Compose cluster's %q", name, d.Cell.Shards, compose.shards[name])
		}
		dsn, err := mysql.ParseDSN(d.Cell.DSN)
		if err != nil {
			add("%s: dsn: %v", name, err)
			continue
		}
		_, behind, err := m.serviceBehind(dsn.Addr, corev1.ProtocolTCP)
		if err != nil {
			add("%s: dsn: %v", name, err)
			continue
		}
		if len(behind) != 1 || k8sRole(behind[0]) != "database" {
			add("%s: dsn %s is not one MariaDB workload (%v)", name, dsn.Addr, behind)
			continue
		}
		db := behind[0]
		if prev, ok := dbOf[db.name]; ok {
			add("%s and %s share the database %s", name, prev, db)
		}
		dbOf[db.name] = name
		var dbEnv string
		for _, e := range db.template.Spec.Containers[0].Env {
			if e.Name == "MARIADB_ROOT_PASSWORD_FILE" {
				dbEnv = e.Value
			}
		}
		vars, _ := pod.env(c)
		cs, ck, ok1 := m.secretKeyAt(w, c, vars["REDCELL_DB_PASSWORD_FILE"])
		ds, dk, ok2 := m.secretKeyAt(db, db.template.Spec.Containers[0], dbEnv)
		if !ok1 || !ok2 || cs != ds || ck != dk || dsn.Passwd != fakeSecret(ck) {
			add("%s: its DSN's password (REDCELL_DB_PASSWORD_FILE, %s %s) is not its database's root password (MARIADB_ROOT_PASSWORD_FILE, %s %s)", name, cs, ck, ds, dk)
		}
	}
	if len(dbOf) != len(dbs) {
		add("%d MariaDB workloads, %d used by a cell", len(dbs), len(dbOf))
	}
	return problems
}
