package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/facet-gpu/facet/internal/testenv"
	"github.com/facet-gpu/facet/pkg/cluster/preempt/controller"
	"github.com/facet-gpu/facet/pkg/model/features"
)

// The PriorityClasses of TestPreempt: batch work, more valued work, and
// the urgent pods that preempt them.
const preemptClasses = `apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: facet-e2e-low}
value: 100
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: facet-e2e-mid}
value: 200
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: facet-e2e-high}
value: 100000
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: facet-e2e-high-never}
value: 100000
preemptionPolicy: Never
`

// preemptTemplates are the claim templates the pods use.
const preemptTemplates = `apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: whole, namespace: facet-demo}
spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.facet.dev}}]}}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: mig-1g10gb, namespace: facet-demo}
spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: mig.facet.dev, selectors: [{cel: {expression: 'device.attributes["gpu.facet.dev"].profile == "1g.10gb"'}}]}}]}}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: mig-3g40gb, namespace: facet-demo}
spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: mig.facet.dev, selectors: [{cel: {expression: 'device.attributes["gpu.facet.dev"].profile == "3g.40gb"'}}]}}]}}}
`

// Templates of the gated shapes (consumable capacity) and of slots.
const shareTemplates = `apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: share-40gi, namespace: facet-demo}
spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: vgpu.facet.dev, capacity: {requests: {memory: 39Gi, cores: "50"}}}}]}}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: share-20gi, namespace: facet-demo}
spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: vgpu.facet.dev, capacity: {requests: {memory: 20Gi, cores: "20"}}}}]}}}
`

const slotTemplates = `apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: slot, namespace: facet-demo}
spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: vgpu-slot.facet.dev}}]}}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: slot-20pct, namespace: facet-demo}
spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: vgpu-slot.facet.dev, selectors: [{cel: {expression: 'device.capacity["gpu.facet.dev"].memory.compareTo(quantity("2000Mi")) >= 0 && device.capacity["gpu.facet.dev"].cores.compareTo(quantity("20")) >= 0'}}]}}]}}}
`

// prioPod is a busybox pod of a PriorityClass, labelled tier, with one
// claim per template (entries c0, c1, ...).
func prioPod(name, class, tier string, templates ...string) string {
	var claims, refs strings.Builder
	for i, tpl := range templates {
		fmt.Fprintf(&refs, "{name: c%d},", i)
		fmt.Fprintf(&claims, "  - {name: c%d, resourceClaimTemplateName: %s}\n", i, tpl)
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: facet-demo, labels: {tier: %s, template: %s}}
spec:
  priorityClassName: %s
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: facet.local/busybox:1
    imagePullPolicy: Never
    command: ["sleep", "86400"]
    resources: {claims: [%s]}
  resourceClaims:
%s`, name, tier, templates[0], class, strings.TrimSuffix(refs.String(), ","), claims.String())
}

// preemptor is a running facet-preemptor.
type preemptor struct{ log string }

// The chart's identity for facet-preemptor: its service account, RBAC and
// ValidatingAdmissionPolicies as the chart renders them for release facet
// in preemptorNS, with preemptor.protectedNamespaces [guardedNS]
// (testdata/preemptor-chart.yaml, kept equal to the render by test/helm's
// TestPreemptorE2EManifest).
const (
	preemptorNS   = "facet-e2e-preemptor"
	preemptorSA   = "facet-preemptor"
	preemptorName = "facet-preemptor" // its Lease, the only one its Role lets it update
	guardedNS     = "facet-e2e-guarded"
)

// chartIdentity installs the chart's identity for the preemptor and
// returns a kubeconfig with a token of its service account, so that the
// preemptor runs with what the chart grants it and the API server's
// policies judge its requests. Removed when t ends.
func chartIdentity(t *testing.T) string {
	t.Helper()
	kubectl(t, "create", "namespace", preemptorNS)
	manifest := filepath.Join(e.repo, "test", "e2e", "testdata", "preemptor-chart.yaml")
	kubectl(t, "apply", "-f", manifest)
	t.Cleanup(func() {
		_, _ = kubectlErr("delete", "-f", manifest, "--ignore-not-found", "--wait=true")
		_, _ = kubectlErr("delete", "namespace", preemptorNS, "--wait=true", "--timeout=120s")
	})
	tok, err := e.client.CoreV1().ServiceAccounts(preemptorNS).CreateToken(context.Background(), preemptorSA, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3 * 3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.LoadFromFile(e.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	cfg.AuthInfos = map[string]*clientcmdapi.AuthInfo{preemptorSA: {Token: tok.Status.Token}}
	cfg.Contexts = map[string]*clientcmdapi.Context{preemptorSA: {Cluster: ctx.Cluster, AuthInfo: preemptorSA}}
	cfg.CurrentContext = preemptorSA
	path := filepath.Join(e.runDir, "facet-preemptor-e2e.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func (p *preemptor) logText() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

var preemptorRuns int

// startPreemptor runs bin/facet-preemptor as a host process against the
// node's API server, as the chart's Deployment runs it in a cluster: with
// the chart's service account (kubeconfig, from chartIdentity), leader
// election on its Lease in preemptorNS, and POD_NAMESPACE preemptorNS.
func startPreemptor(t *testing.T, kubeconfig string, extra ...string) *preemptor {
	t.Helper()
	preemptorRuns++
	t.Setenv("POD_NAMESPACE", preemptorNS)
	p := &preemptor{log: filepath.Join(e.runDir, "logs", fmt.Sprintf("facet-preemptor-e2e-%d.log", preemptorRuns))}
	args := append([]string{"--kubeconfig", kubeconfig, "--leader-elect-namespace=" + preemptorNS, "--leader-elect-name=" + preemptorName,
		"--metrics-addr", "127.0.0.1:0", "--resync", "2s", "--backoff", "2s", "-v", "2"}, extra...)
	testenv.StartProcess(t, p.log, filepath.Join(e.repo, "bin", "facet-preemptor"), args...)
	return p
}

var preemptorMetricsRE = regexp.MustCompile(`"Serving metrics and health" addr="([^"]+)"`)

// metric reads one unlabelled counter from the preemptor's /metrics.
func (p *preemptor) metric(t *testing.T, name string) float64 {
	t.Helper()
	v, ok := p.series(t, name)
	if !ok {
		t.Fatalf("no %s in /metrics", name)
	}
	return v
}

// series reads one series, its labels as the exposition format orders
// them (`name{a="x",b="y"}`), from the preemptor's /metrics; false when it
// is not there.
func (p *preemptor) series(t *testing.T, series string) (float64, bool) {
	t.Helper()
	m := preemptorMetricsRE.FindStringSubmatch(p.logText())
	if m == nil {
		t.Fatalf("no metrics address in the preemptor's log:\n%s", p.logText())
	}
	resp, err := http.Get("http://" + m[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f, true
		}
	}
	return 0, false
}

// tierPods lists the demo namespace's pods of a tier that are not being
// deleted.
func tierPods(t *testing.T, tier string) []corev1.Pod {
	t.Helper()
	list, err := e.client.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "tier=" + tier})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

var batchPods int

// fill leaves n pods of tier batch (PriorityClass class, claims from
// template) Running and none Pending, and no other pod.
func fill(t *testing.T, n int, class, template string) {
	t.Helper()
	kubectl(t, "delete", "pods", "-n", namespace, "-l", "tier!=batch", "--wait=true", "--timeout=120s")
	kubectl(t, "delete", "pods", "-n", namespace, "-l", "tier=batch,template!="+template, "--wait=true", "--timeout=120s")
	alive := tierPods(t, "batch")
	for _, p := range alive[min(n, len(alive)):] {
		kubectl(t, "delete", "pod", "-n", namespace, p.Name, "--wait=true", "--timeout=120s")
	}
	for i := len(alive); i < n; i++ {
		batchPods++
		applyYAML(t, prioPod(fmt.Sprint("batch-", batchPods), class, "batch", template))
	}
	waitFor(t, fmt.Sprintf("%d batch pods Running", n), 3*time.Minute, func() (bool, error) {
		running := 0
		for _, p := range tierPods(t, "batch") {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		return running == n, fmt.Errorf("%d Running", running)
	})
}

// waitUnschedulable waits until the scheduler has given up on the pod for
// its claims: what the preemptor acts on.
func waitUnschedulable(t *testing.T, name string) {
	t.Helper()
	waitFor(t, "pod "+name+" unschedulable for its claims", time.Minute, func() (bool, error) {
		p, err := e.client.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return controller.Unschedulable(p), fmt.Errorf("conditions %v", p.Status.Conditions)
	})
}

// preemptedFor counts the FacetPreempted Events that name the preemptor:
// its victims.
func preemptedFor(t *testing.T, pod string) []string {
	t.Helper()
	evs, err := e.client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{FieldSelector: "reason=" + controller.ReasonPreempted})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ev := range evs.Items {
		if strings.Contains(ev.Message, namespace+"/"+pod+" (") {
			out = append(out, ev.InvolvedObject.Name)
		}
	}
	return out
}

// preemptsOnly creates the urgent pod (claims from templates) and checks
// that it runs after exactly the victims wanted (count, each of tier
// victimTier) are evicted, and no pod of the tiers spared.
func preemptsOnly(t *testing.T, name string, templates []string, victims int, victimTier string, spared ...string) {
	t.Helper()
	before := map[string]int{victimTier: len(tierPods(t, victimTier))}
	for _, s := range spared {
		before[s] = len(tierPods(t, s))
	}
	applyYAML(t, prioPod(name, "facet-e2e-high", "urgent", templates...))
	waitPodRunning(t, name)
	if got := before[victimTier] - len(tierPods(t, victimTier)); got != victims {
		t.Errorf("%d %s pods evicted, want %d", got, victimTier, victims)
	}
	for _, s := range spared {
		if got := before[s] - len(tierPods(t, s)); got != 0 {
			t.Errorf("%d %s pods evicted, want none", got, s)
		}
	}
	waitFor(t, "FacetPreempted events naming "+name, time.Minute, func() (bool, error) {
		v := preemptedFor(t, name)
		return len(v) == victims, fmt.Errorf("victims per Events: %v", v)
	})
	waitEvent(t, name, controller.ReasonPreempting, "evicted")
}

// preemptSetup makes the demo namespace, the PriorityClasses (removed at
// the end) and the claim templates of the preemption tests.
func preemptSetup(t *testing.T) {
	t.Helper()
	setupNamespace(t)
	applyYAML(t, preemptClasses)
	t.Cleanup(func() {
		_, _ = kubectlErr("delete", "priorityclass", "facet-e2e-low", "facet-e2e-mid", "facet-e2e-high", "facet-e2e-high-never", "--ignore-not-found")
	})
	applyYAML(t, preemptTemplates)
}

// TestPreempt runs facet-preemptor against the node: the 8 + 1 case
// (repeated, FACET_E2E_PREEMPT_ROUNDS times, default 3, the later rounds
// with a rival batch pod pending), the rules that forbid a preemption, a
// two-claim preemptor, and the partitioned shapes the cluster offers
// (static MIG and slots on stock 1.35; dynamic MIG and shares with the
// gates on).
func TestPreempt(t *testing.T) {
	preemptSetup(t)
	identity := chartIdentity(t)
	pre := startPreemptor(t, identity)

	t.Run("it acts, and says why", func(t *testing.T) {
		waitFor(t, "the preemptor's start", time.Minute, func() (bool, error) {
			log := pre.logText()
			return strings.Contains(log, "Watching for pods whose ResourceClaims cannot be allocated"), fmt.Errorf("log:\n%s", log)
		})
		log := pre.logText()
		for _, want := range []string{"the kube-scheduler does not", "knows none of the gates DRAPreemption", "Allocator features"} {
			if !strings.Contains(log, want) {
				t.Errorf("log lacks %q:\n%s", want, log)
			}
		}
		// The allocator runs with the cluster's own gates.
		want := "DRAPartitionableDevices=" + strconv.FormatBool(e.gates.Has(features.PartitionableDevices))
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	})

	t.Run("it stays idle where the scheduler preempts (override)", func(t *testing.T) {
		idle := startPreemptor(t, identity, "--leader-elect=false", "--scheduler-preempts-claims=true")
		waitFor(t, "the idle preemptor's log", time.Minute, func() (bool, error) {
			log := idle.logText()
			return strings.Contains(log, "Staying idle") && strings.Contains(log, "--scheduler-preempts-claims=true"), fmt.Errorf("log:\n%s", log)
		})
		if v := idle.metric(t, "facet_preemptor_active"); v != 0 {
			t.Errorf("facet_preemptor_active %v, want 0", v)
		}
	})

	plugin := startPlugin(t, "dgx-h100", "--mode", "exclusive")
	t.Cleanup(func() { _, _ = kubectlErr("delete", "pods", "--all", "-n", namespace, "--wait=true", "--timeout=180s") })

	t.Run("8 + 1: one victim, the preemptor Running", func(t *testing.T) {
		rounds := 3
		if s := os.Getenv("FACET_E2E_PREEMPT_ROUNDS"); s != "" {
			var err error
			if rounds, err = strconv.Atoi(s); err != nil || rounds < 1 {
				t.Fatalf("FACET_E2E_PREEMPT_ROUNDS=%q", s)
			}
		}
		var took []time.Duration
		rivalFirst := 0
		for k := range rounds {
			fill(t, 8, "facet-e2e-low", "whole")
			urgent := fmt.Sprint("urgent-", k)
			rival := ""
			if k > 0 {
				// A batch pod that wants a GPU too, as a Job's
				// or Deployment's replacement would: will it take
				// the freed GPU first?
				rival = fmt.Sprint("rival-", k)
				applyYAML(t, prioPod(rival, "facet-e2e-low", "batch", "whole"))
				waitUnschedulable(t, rival)
			}
			start := time.Now()
			applyYAML(t, prioPod(urgent, "facet-e2e-high", "urgent", "whole"))
			var rivalAt, urgentAt time.Time
			waitFor(t, urgent+" Running", 3*time.Minute, func() (bool, error) {
				now := time.Now()
				if rival != "" && rivalAt.IsZero() {
					if p, err := e.client.CoreV1().Pods(namespace).Get(context.Background(), rival, metav1.GetOptions{}); err == nil && p.Spec.NodeName != "" {
						rivalAt = now
					}
				}
				p, err := e.client.CoreV1().Pods(namespace).Get(context.Background(), urgent, metav1.GetOptions{})
				if err != nil {
					return false, err
				}
				if urgentAt.IsZero() && p.Spec.NodeName != "" {
					urgentAt = now
				}
				return p.Status.Phase == corev1.PodRunning, fmt.Errorf("phase %s", p.Status.Phase)
			})
			took = append(took, time.Since(start))
			if !rivalAt.IsZero() && !rivalAt.After(urgentAt) {
				rivalFirst++
			}
			waitFor(t, "FacetPreempted events naming "+urgent, time.Minute, func() (bool, error) {
				return len(preemptedFor(t, urgent)) > 0, nil
			})
			victims := preemptedFor(t, urgent)
			t.Logf("round %d: %s Running %s after its creation; victims %v; rival %q scheduled first: %t",
				k, urgent, took[k].Round(10*time.Millisecond), victims, rival, !rivalAt.IsZero() && !rivalAt.After(urgentAt))
			if k == 0 {
				if len(victims) != 1 {
					t.Errorf("victims %v, want exactly one", victims)
				}
				if n := len(tierPods(t, "batch")); n != 7 {
					t.Errorf("%d batch pods left, want 7", n)
				}
				waitEvent(t, urgent, controller.ReasonPreempting, victims[0])
			}
		}
		t.Logf("8 + 1 over %d rounds: creation to Running %v; a rival batch pod took the freed GPU first in %d of %d rounds with a rival",
			rounds, took, rivalFirst, rounds-1)
		// With the chart's RBAC and policies: every eviction and
		// nomination went through.
		for _, bad := range []string{"Eviction failed", "Could not nominate", "forbidden"} {
			if log := pre.logText(); strings.Contains(log, bad) {
				t.Errorf("the preemptor's log says %q:\n%s", bad, log)
			}
		}
		if v := pre.metric(t, "facet_preemptor_preemptions_total"); v < float64(rounds) {
			t.Errorf("facet_preemptor_preemptions_total %v, want at least %d", v, rounds)
		}
	})

	// nothing creates the pod and checks that the preemptor says why it
	// evicts nothing, and evicts nothing.
	nothing := func(t *testing.T, name, class string, reason, why string, setup func()) {
		fill(t, 8, "facet-e2e-low", "whole")
		if setup != nil {
			setup()
		}
		applyYAML(t, prioPod(name, class, "urgent", "whole"))
		waitEvent(t, name, reason, why)
		if n := len(tierPods(t, "batch")); n != 8 {
			t.Errorf("%d batch pods left, want all 8", n)
		}
		if v := preemptedFor(t, name); len(v) != 0 {
			t.Errorf("pods preempted for %s: %v", name, v)
		}
	}
	t.Run("equal priority: nothing evicted", func(t *testing.T) {
		nothing(t, "peer", "facet-e2e-low", controller.ReasonNotPreempting, "lower priority than 100", nil)
	})
	t.Run("preemptionPolicy Never: nothing evicted", func(t *testing.T) {
		nothing(t, "polite", "facet-e2e-high-never", controller.ReasonNotPreempting, "preemptionPolicy is Never", nil)
	})
	t.Run("a PodDisruptionBudget forbids the eviction: nothing evicted, an Event", func(t *testing.T) {
		nothing(t, "blocked", "facet-e2e-high", controller.ReasonBlocked, "was refused", func() {
			applyYAML(t, `apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: batch, namespace: facet-demo}
spec: {maxUnavailable: 0, selector: {matchLabels: {tier: batch}}}
`)
			t.Cleanup(func() { _, _ = kubectlErr("delete", "pdb", "-n", namespace, "batch", "--ignore-not-found") })
		})
		// The pod first: without the budget it would preempt.
		kubectl(t, "delete", "pod", "-n", namespace, "blocked", "--wait=true", "--timeout=120s")
		kubectl(t, "delete", "pdb", "-n", namespace, "batch")
	})
	t.Run("two claims of a GPU each: two victims on the node", func(t *testing.T) {
		fill(t, 8, "facet-e2e-low", "whole")
		preemptsOnly(t, "two-gpus", []string{"whole", "whole"}, 2, "batch")
	})

	// The chart's preemptor never evicts in kube-system (nor in its own
	// namespace or --protected-namespaces): there, the only pod of lower
	// priority that would make room stays, and the preemptor says why.
	t.Run("a kube-system pod is never a victim", func(t *testing.T) {
		kubectl(t, "delete", "pods", "--all", "-n", namespace, "--wait=true", "--timeout=180s")
		fill(t, 7, "facet-e2e-high", "whole") // as urgent as the preemptor
		sys := "kube-system"
		applyYAML(t, strings.ReplaceAll(strings.SplitN(preemptTemplates, "---", 2)[0], "namespace: facet-demo", "namespace: "+sys))
		applyYAML(t, strings.Replace(prioPod("sys-batch", "facet-e2e-low", "batch", "whole"), "namespace: facet-demo", "namespace: "+sys, 1))
		t.Cleanup(func() {
			_, _ = kubectlErr("delete", "pod", "-n", sys, "sys-batch", "--ignore-not-found", "--wait=true", "--timeout=120s")
			_, _ = kubectlErr("delete", "resourceclaimtemplate", "-n", sys, "whole", "--ignore-not-found")
		})
		waitFor(t, "kube-system/sys-batch Running", 3*time.Minute, func() (bool, error) {
			p, err := e.client.CoreV1().Pods(sys).Get(context.Background(), "sys-batch", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return p.Status.Phase == corev1.PodRunning, fmt.Errorf("phase %s", p.Status.Phase)
		})
		applyYAML(t, prioPod("guarded", "facet-e2e-high", "urgent", "whole"))
		waitEvent(t, "guarded", controller.ReasonNotPreempting, "are protected: kube-system/sys-batch")
		p, err := e.client.CoreV1().Pods(sys).Get(context.Background(), "sys-batch", metav1.GetOptions{})
		if err != nil || p.DeletionTimestamp != nil {
			t.Errorf("kube-system/sys-batch evicted or going: %v", err)
		}
		if v := preemptedFor(t, "guarded"); len(v) != 0 {
			t.Errorf("pods preempted for guarded: %v", v)
		}
		if n := len(tierPods(t, "batch")); n != 7 {
			t.Errorf("%d batch pods left in %s, want all 7", n, namespace)
		}
	})

	// A namespace the chart's policy protects (preemptor.protectedNamespaces
	// in testdata/preemptor-chart.yaml) while this preemptor's flags do
	// not: its code picks the pod there, the API server refuses the dry-run
	// eviction of the chart's service account, and the preemptor looks
	// elsewhere, finds nothing, and says why, naming the policy.
	t.Run("a pod only the chart's policy protects: the API server refuses its eviction", func(t *testing.T) {
		kubectl(t, "delete", "pods", "--all", "-n", namespace, "--wait=true", "--timeout=180s")
		fill(t, 7, "facet-e2e-high", "whole")
		kubectl(t, "create", "namespace", guardedNS)
		t.Cleanup(func() { _, _ = kubectlErr("delete", "namespace", guardedNS, "--wait=true", "--timeout=180s") })
		applyYAML(t, strings.ReplaceAll(strings.SplitN(preemptTemplates, "---", 2)[0], "namespace: facet-demo", "namespace: "+guardedNS))
		applyYAML(t, strings.Replace(prioPod("guarded-batch", "facet-e2e-low", "batch", "whole"), "namespace: facet-demo", "namespace: "+guardedNS, 1))
		var victim *corev1.Pod
		waitFor(t, guardedNS+"/guarded-batch Running", 3*time.Minute, func() (bool, error) {
			var err error
			if victim, err = e.client.CoreV1().Pods(guardedNS).Get(context.Background(), "guarded-batch", metav1.GetOptions{}); err != nil {
				return false, err
			}
			return victim.Status.Phase == corev1.PodRunning, fmt.Errorf("phase %s", victim.Status.Phase)
		})
		applyYAML(t, prioPod("refused", "facet-e2e-high", "urgent", "whole"))
		waitEvent(t, "refused", controller.ReasonBlocked, "the eviction of "+guardedNS+`/guarded-batch (pods "guarded-batch" is forbidden: ValidatingAdmissionPolicy 'facet-preemptor-evictions'`)
		p, err := e.client.CoreV1().Pods(guardedNS).Get(context.Background(), "guarded-batch", metav1.GetOptions{})
		if err != nil || p.UID != victim.UID || p.DeletionTimestamp != nil {
			t.Errorf("%s/guarded-batch evicted or going: %v", guardedNS, err)
		}
		kubectl(t, "delete", "pod", "-n", namespace, "refused", "--wait=true", "--timeout=120s")
	})

	// The partitioned shapes, each on a plugin of its own.
	kubectl(t, "delete", "pods", "--all", "-n", namespace, "--wait=true", "--timeout=180s")
	plugin.stop()
	if e.gates.Has(features.PartitionableDevices) && e.gates.Has(features.ConsumableCapacity) {
		p := startPlugin(t, "dgx-h100", "--mode", "exclusive", "--gpu-modes", "0=mig,1=shared")
		t.Cleanup(resetSimulatedGPUs(t, p))
		deleteNamespaceAtEnd(t)
		applyYAML(t, shareTemplates)
		t.Run("dynamic MIG 1g.10gb: one MIG pod, not a whole GPU of lower priority", func(t *testing.T) {
			fill(t, 2, "facet-e2e-mid", "mig-3g40gb") // GPU 0 full
			applyYAML(t, prioPod("whole-low", "facet-e2e-low", "whole", "whole"))
			waitPodRunning(t, "whole-low")
			preemptsOnly(t, "mig-urgent", []string{"mig-1g10gb"}, 1, "batch", "whole")
		})
		t.Run("a share frees capacity: one of two shares", func(t *testing.T) {
			fill(t, 2, "facet-e2e-low", "share-40gi") // GPU 1's memory
			preemptsOnly(t, "share-urgent", []string{"share-20gi"}, 1, "batch")
		})
		return
	}
	p := startPlugin(t, "dgx-h100", stockModes...)
	t.Cleanup(resetSimulatedGPUs(t, p))
	deleteNamespaceAtEnd(t)
	applyYAML(t, slotTemplates)
	t.Run("static MIG 1g.10gb: one MIG pod, not a whole GPU of lower priority", func(t *testing.T) {
		fill(t, 4, "facet-e2e-mid", "mig-1g10gb") // the layouts' four 1g.10gb
		applyYAML(t, prioPod("whole-low", "facet-e2e-low", "whole", "whole"))
		waitPodRunning(t, "whole-low")
		preemptsOnly(t, "mig-urgent", []string{"mig-1g10gb"}, 1, "batch", "whole")
	})
	t.Run("slots: the one slot needed", func(t *testing.T) {
		fill(t, 3, "facet-e2e-low", "slot") // GPU 4's three slots
		preemptsOnly(t, "slot-urgent", []string{"slot-20pct"}, 1, "batch")
	})
}

// TestPreemptObserveOnly runs facet-preemptor with --observe-only, as an
// operator would before letting it evict: for the 8 + 1 case it raises
// its Events and metrics ("would evict") and evicts nothing.
func TestPreemptObserveOnly(t *testing.T) {
	preemptSetup(t)
	startPlugin(t, "dgx-h100", "--mode", "exclusive")
	// Its templates ("whole") are not the later tests' of the same name.
	deleteNamespaceAtEnd(t)
	fill(t, 8, "facet-e2e-low", "whole")
	obs := startPreemptor(t, chartIdentity(t), "--leader-elect=false", "--observe-only")
	applyYAML(t, prioPod("watched", "facet-e2e-high", "urgent", "whole"))
	waitEvent(t, "watched", controller.ReasonPreempting, "(observe-only) would evict")
	// The victim's Event comes with the decision; nothing is evicted,
	// before it or after.
	waitFor(t, "the would-be victim's Event", time.Minute, func() (bool, error) {
		v := preemptedFor(t, "watched")
		return len(v) == 1, fmt.Errorf("victims per Events: %v", v)
	})
	if n := len(tierPods(t, "batch")); n != 8 {
		t.Errorf("%d batch pods left, want all 8", n)
	}
	p, err := e.client.CoreV1().Pods(namespace).Get(context.Background(), "watched", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != "" {
		t.Errorf("watched was scheduled to %s: something made room", p.Spec.NodeName)
	}
	if v := obs.metric(t, "facet_preemptor_observed_preemptions_total"); v < 1 {
		t.Errorf("facet_preemptor_observed_preemptions_total %v, want at least 1", v)
	}
	if v := obs.metric(t, "facet_preemptor_observed_victims_total"); v < 1 {
		t.Errorf("facet_preemptor_observed_victims_total %v, want at least 1", v)
	}

	// Why a pod is Pending, where its user looks first: a claim for nine
	// whole GPUs of an eight-GPU node fits nowhere, whatever is evicted.
	// The scheduler's Event says only "cannot allocate all claims"; the
	// preemptor (here observe-only) adds fit's reason on the pod.
	applyYAML(t, `apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: nine, namespace: facet-demo}
spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.facet.dev, allocationMode: ExactCount, count: 9}}]}}}
`)
	start := time.Now()
	applyYAML(t, prioPod("nine", "facet-e2e-high", "urgent", "nine"))
	waitEvent(t, "nine", controller.ReasonUnallocatable, "request gpu: only 8 device(s) on the node match DeviceClass gpu.facet.dev and the request's selectors, need 9")
	t.Logf("FacetUnallocatable %s after the pod was created", time.Since(start).Round(100*time.Millisecond))
	// The same pod, counted for FacetMIGProfileExhausted's metric (no MIG
	// profile: a whole GPU), and no longer once it is gone.
	const unalloc = `facet_preemptor_unallocatable_requests{device_class="gpu.facet.dev",mig_profile=""}`
	waitFor(t, "the unallocatable request counted", 30*time.Second, func() (bool, error) {
		v, ok := obs.series(t, unalloc)
		return ok && v == 1, fmt.Errorf("%s: %v (served: %v)", unalloc, v, ok)
	})
	if err := e.client.CoreV1().Pods(namespace).Delete(context.Background(), "nine", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deleted pod's request uncounted", 30*time.Second, func() (bool, error) {
		v, ok := obs.series(t, unalloc)
		return !ok, fmt.Errorf("%s still served: %v", unalloc, v)
	})
}
