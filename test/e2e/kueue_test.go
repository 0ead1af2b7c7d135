package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/facet-gpu/facet/internal/testenv"
	"github.com/facet-gpu/facet/pkg/model/features"
)

// TestKueue runs Kueue v0.17.0 (hack/kueue.sh, built by hack/build-kueue.sh)
// beside the node, with the DeviceClasses of `facetctl classes` mapped in
// its deviceClassMappings, and checks that its quotas hold for every shape
// the node has: whole GPUs (quota, borrowing, gang admission), MIG devices,
// vGPU slots and, with the gates on, vGPU shares; that pods rewritten by
// Facet's pod mutator in Kueue mode are counted once; and where Kueue v0.17
// cannot count (a claim with a CEL selector, a claim made beforehand),
// that it refuses the Job, saying why. It runs on make e2e's 1.35 rounds,
// stock and gates on; hack/e2e.sh builds Kueue before them.
func TestKueue(t *testing.T) {
	if v := utilversion.MustParseSemantic(e.gates.ServerVersion); v.Major() != 1 || v.Minor() != 35 {
		// Kueue v0.17.0 is built against Kubernetes 1.35's API; each
		// round costs about 3 minutes, and 1.36 serves the shapes of 1.35
		// with the gates on.
		t.Skipf("Kueue v0.17.0 runs on the Kubernetes 1.35 rounds (stock and gates on), this is %s", e.gates.ServerVersion)
	}
	ctx := context.Background()
	setupNamespace(t)
	shares := e.gates.Has(features.ConsumableCapacity) && e.gates.Has(features.PartitionableDevices)
	// GPUs 0-1 MIG (carved at prepare, or on stock carved at start into
	// seven 1g.10gb each and published as static MIG devices), 2-3 vGPU
	// slots (four of 20253 MiB and 25 % each, under MPS), with the gates on 4 shared,
	// the rest whole.
	modes := []string{"--gpu-modes", "0-1=static-mig,2-3=slots", "--mig-layouts", "0-1=all-1g.10gb"}
	if shares {
		modes = []string{"--gpu-modes", "0-1=mig,2-3=slots,4=shared"}
	}
	p := startPlugin(t, "dgx-h100", append(modes, "--mode", "exclusive")...)
	t.Cleanup(resetSimulatedGPUs(t, p))
	deleteNamespaceAtEnd(t)

	// The classes, from the node's slices, as a platform team makes them.
	classes := filepath.Join(e.runDir, "kueue-classes.yaml")
	var out []byte
	waitFor(t, "facetctl classes to see the slots", time.Minute, func() (bool, error) {
		var err error
		out, err = exec.Command(e.facetctl, "classes", "--kubeconfig", e.kubeconfig, "--share-sizes", "2000Mi/20").Output()
		return err == nil && strings.Contains(string(out), kueueSlot+".facet.dev") && strings.Contains(string(out), "mig-1g.10gb.facet.dev"), err
	})
	if err := os.WriteFile(classes, out, 0o644); err != nil {
		t.Fatal(err)
	}
	kubectl(t, "apply", "-f", classes)

	start := time.Now()
	cmd := exec.Command(filepath.Join(e.repo, "hack", "kueue.sh"), "start", e.runDir)
	cmd.Env = append(os.Environ(), "FACET_KUEUE_CLASSES="+classes)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/kueue.sh start: %v\n%s", err, out)
	}
	t.Logf("Kueue started in %v", time.Since(start).Round(time.Second))
	t.Cleanup(func() {
		// While Kueue runs: it removes the finalizers it put on the
		// Workloads, queues and flavors (and on the pods it manages),
		// without which the namespace would never go.
		for _, args := range [][]string{
			{"delete", "jobs", "-n", namespace, "-l", "facet.dev/e2e-kueue=true", "--cascade=foreground"},
			{"delete", "workloads.kueue.x-k8s.io,localqueues.kueue.x-k8s.io", "-n", namespace, "--all"},
			{"delete", "clusterqueues.kueue.x-k8s.io,resourceflavors.kueue.x-k8s.io", "--all"},
		} {
			if out, err := kubectlErr(append(args, "--wait=true", "--timeout=120s")...); err != nil {
				t.Logf("kubectl %v: %v\n%s", args, err, out)
			}
		}
		_, _ = kubectlErr("delete", "deviceclasses", "-l", "app.kubernetes.io/managed-by=facetctl")
		if out, err := exec.Command(filepath.Join(e.repo, "hack", "kueue.sh"), "stop", e.runDir).CombinedOutput(); err != nil {
			t.Logf("hack/kueue.sh stop: %v\n%s", err, out)
		}
		// Whatever is left holds Kueue's finalizers, which nobody removes now.
		for _, kind := range []string{"workloads.kueue.x-k8s.io", "localqueues.kueue.x-k8s.io", "clusterqueues.kueue.x-k8s.io", "resourceflavors.kueue.x-k8s.io", "pods"} {
			out, _ := kubectlErr("get", kind, "-A", "-o", `jsonpath={range .items[?(@.metadata.finalizers)]}{.metadata.namespace}{"/"}{.metadata.name}{"\n"}{end}`)
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				ns, name, ok := strings.Cut(line, "/")
				if !ok || (kind == "pods" && ns != namespace) {
					continue
				}
				args := []string{"patch", kind, name, "--type=merge", "-p", `{"metadata":{"finalizers":null}}`}
				if ns != "" {
					args = append(args, "-n", ns)
				}
				_, _ = kubectlErr(args...)
			}
		}
	})
	applyYAML(t, "apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata: {name: default}\n")

	t.Run("whole GPUs: quota, borrowing, the time from freed quota to a running Job", func(t *testing.T) {
		applyYAML(t, clusterQueue("team-a", "facet", "facet.dev/gpu", 2, ptrTo(0))+clusterQueue("team-b", "facet", "facet.dev/gpu", 2, nil)+
			localQueue("team-a")+localQueue("team-b")+template("gpu", "gpu.facet.dev", ""))
		defer deleteJobs(t, "gpu")
		admitted, held := admitsQuota(t, "team-a", "gpu", "facet.dev/gpu", 2, 3)

		// Freeing quota: the waiting Job is admitted and runs.
		t.Logf("whole GPUs: %s", freeQuota(t, admitted[0], held[0], 1))

		// Borrowing: team-a may borrow 1 from the idle team-b.
		applyYAML(t, kueueJob("gpu-4", "team-a", "gpu", 1))
		waitWorkloads(t, map[string]bool{"gpu-4": false}, "insufficient unused quota")
		applyYAML(t, clusterQueue("team-a", "facet", "facet.dev/gpu", 2, ptrTo(1)))
		waitWorkloads(t, map[string]bool{"gpu-4": true}, "")
		waitJobPodsRunning(t, "gpu-4", 1)
		// 2 of its own, 1 borrowed.
		waitUsage(t, "team-a", map[string]string{"facet.dev/gpu": "3"})
	})

	t.Run("whole GPUs: gang admission, all or nothing", func(t *testing.T) {
		applyYAML(t, clusterQueue("gang", "", "facet.dev/gpu", 4, nil)+localQueue("gang")+template("gpu", "gpu.facet.dev", ""))
		defer deleteJobs(t, "gang")
		applyYAML(t, kueueJob("gang-1", "gang", "gpu", 1))
		waitJobPodsRunning(t, "gang-1", 1)
		applyYAML(t, kueueJob("gang-4", "gang", "gpu", 4))
		waitWorkloads(t, map[string]bool{"gang-4": false}, "insufficient unused quota for facet.dev/gpu in flavor default, 1 more needed")
		if n, c := jobPods(t, "gang-4"), jobClaims(t, "gang-4"); n != 0 || c != 0 {
			t.Fatalf("gang-4 is not admitted but has %d pods and %d claims", n, c)
		}
		t.Logf("gang: the 4-pod Job was held whole with 3 GPUs of quota left (0 pods, 0 claims); %s", freeQuota(t, "gang-1", "gang-4", 4))
	})

	t.Run("MIG: a quota of seven 1g.10gb admits seven Jobs and holds the eighth", func(t *testing.T) {
		applyYAML(t, clusterQueue("mig", "", "facet.dev/mig-1g.10gb", 7, nil)+localQueue("mig")+template("mig", "mig-1g.10gb.facet.dev", ""))
		defer deleteJobs(t, "mig")
		admitsQuota(t, "mig", "mig", "facet.dev/mig-1g.10gb", 7, 8)
	})

	t.Run("vGPU slots: quota per size", func(t *testing.T) {
		applyYAML(t, clusterQueue("slots", "", "facet.dev/"+kueueSlot, 2, nil)+localQueue("slots")+template("slot", kueueSlot+".facet.dev", ""))
		defer deleteJobs(t, "slot")
		admitsQuota(t, "slots", "slot", "facet.dev/"+kueueSlot, 2, 3)
	})

	t.Run("vGPU shares: quota per size class", func(t *testing.T) {
		if !shares {
			t.Skip("vGPU shares need DRAConsumableCapacity and DRAPartitionableDevices, off on stock 1.35")
		}
		applyYAML(t, clusterQueue("shares", "", "facet.dev/vgpu-2000mi-20", 2, nil)+localQueue("shares")+template("share", "vgpu-2000mi-20.facet.dev", "{memory: 2000Mi, cores: \"20\"}"))
		defer deleteJobs(t, "share")
		admitsQuota(t, "shares", "share", "facet.dev/vgpu-2000mi-20", 2, 3)
	})

	t.Run("the limits: a claim with a CEL selector, and a claim made beforehand, are refused", func(t *testing.T) {
		applyYAML(t, clusterQueueMulti("limits", map[string]int{"facet.dev/gpu": 1, "facet.dev/mig-1g.10gb": 7})+localQueue("limits")+`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: cel, namespace: facet-demo}
spec:
  spec:
    devices:
      requests:
      - name: req
        exactly:
          deviceClassName: mig.facet.dev
          selectors:
          - cel: {expression: 'device.capacity["gpu.facet.dev"].memory.compareTo(quantity("3Gi")) >= 0'}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: premade, namespace: facet-demo}
spec:
  devices:
    requests:
    - name: req
      exactly: {deviceClassName: gpu.facet.dev}
---
`)
		defer func() { _, _ = kubectlErr("delete", "resourceclaim", "premade", "-n", namespace, "--ignore-not-found") }()
		defer deleteJobs(t, "limit")
		applyYAML(t, kueueJob("limit-cel", "limits", "cel", 1))
		// A pod's resourceClaims entry naming a ResourceClaim, even of a
		// mapped class without CEL: Kueue v0.17's Workload controller
		// refuses it (pkg/controller/core/workload_controller.go).
		applyYAML(t, strings.Replace(kueueJob("limit-premade", "limits", "premade", 1), "resourceClaimTemplateName:", "resourceClaimName:", 1))
		waitWorkloads(t, map[string]bool{"limit-cel": false}, "ResourceClaimTemplate cel: CEL selectors are not supported")
		waitWorkloads(t, map[string]bool{"limit-premade": false}, "DynamicResourceAllocation feature does not support use of resource claims")
		for _, j := range []string{"limit-cel", "limit-premade"} {
			if n := jobPods(t, j); n != 0 {
				t.Errorf("%s is not admitted but has %d pods", j, n)
			}
		}
	})

	t.Run("pods rewritten by the mutator in Kueue mode are admitted and counted once", func(t *testing.T) {
		addr, caPEM, logPath := startWebhook(t, "facet-webhook-kueue-e2e.log", "--mutate-pods", "--kueue", "auto", "--kubeconfig", e.kubeconfig, "-v", "4")
		registerPodMutator(t, "facet-e2e-kueue-mutate-pods", addr, caPEM, logPath, "")
		applyYAML(t, clusterQueueMulti("mutated", map[string]int{"facet.dev/gpu": 1, "facet.dev/" + kueueSlot: 1})+localQueue("mutated"))
		pod := func(name string, limits map[string]string) *corev1.Pod {
			p := extendedResourcePod(name, "nvidia.com/gpu")
			p.Labels = map[string]string{mutateLabel: "true", "kueue.x-k8s.io/queue-name": "mutated"}
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{}
			for k, v := range limits {
				p.Spec.Containers[0].Resources.Limits[corev1.ResourceName(k)] = resource.MustParse(v)
			}
			return p
		}
		defer func() {
			_, _ = kubectlErr("delete", "pods", "kueue-gpu", "kueue-volcano", "-n", namespace, "--ignore-not-found", "--wait=true", "--timeout=120s")
		}()
		for name, limits := range map[string]map[string]string{
			"kueue-gpu":     {"nvidia.com/gpu": "1"},
			"kueue-volcano": {"volcano.sh/vgpu-memory": "2000", "volcano.sh/vgpu-cores": "20"},
		} {
			created, err := e.client.CoreV1().Pods(namespace).Create(ctx, pod(name, limits), metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if len(created.Spec.ResourceClaims) != 1 || len(created.Spec.Containers[0].Resources.Limits) != 0 {
				t.Fatalf("%s was not rewritten: claims %v, limits %v", name, created.Spec.ResourceClaims, created.Spec.Containers[0].Resources.Limits)
			}
		}
		waitPodRunning(t, "kueue-gpu")
		waitPodRunning(t, "kueue-volcano")
		waitUsage(t, "mutated", map[string]string{"facet.dev/gpu": "1", "facet.dev/" + kueueSlot: "1", "nvidia.com/gpu": "", "volcano.sh/vgpu-memory": ""})
	})
}

// kueueSlot is the slot size of the slots-mode GPUs' default layout, four
// equal slots of a simulated H100 whose slots are MPS clients (every e2e
// plugin has facet-mps beside it): 81079 MiB, as on the card, less the MPS
// server's 66 MiB (docs/mps.md), in four: 20253 MiB and 25 % each.
const kueueSlot = "vgpu-slot-20253mi-25"

func clusterQueue(name, cohort, res string, nominal int, borrowingLimit *int) string {
	s := fmt.Sprintf(`apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: %s}
spec:
  namespaceSelector: {}
`, name)
	if cohort != "" {
		s += "  cohortName: " + cohort + "\n"
	}
	s += fmt.Sprintf(`  resourceGroups:
  - coveredResources: [%q]
    flavors:
    - name: default
      resources:
      - name: %q
        nominalQuota: %d
`, res, res, nominal)
	if borrowingLimit != nil {
		s += fmt.Sprintf("        borrowingLimit: %d\n", *borrowingLimit)
	}
	return s + "---\n"
}

func clusterQueueMulti(name string, quotas map[string]int) string {
	var covered, res []string
	for r, n := range quotas {
		covered = append(covered, fmt.Sprintf("%q", r))
		res = append(res, fmt.Sprintf("      - {name: %q, nominalQuota: %d}\n", r, n))
	}
	return fmt.Sprintf(`apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: %s}
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [%s]
    flavors:
    - name: default
      resources:
%s---
`, name, strings.Join(covered, ", "), strings.Join(res, ""))
}

func localQueue(name string) string {
	return fmt.Sprintf("apiVersion: kueue.x-k8s.io/v1beta2\nkind: LocalQueue\nmetadata: {name: %s, namespace: %s}\nspec: {clusterQueue: %s}\n---\n", name, namespace, name)
}

// template is a ResourceClaimTemplate asking for one device of class, and
// nothing else but capacity (a YAML flow mapping, or "").
func template(name, class, capacity string) string {
	s := fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: %s, namespace: %s}
spec:
  spec:
    devices:
      requests:
      - name: req
        exactly:
          deviceClassName: %s
`, name, namespace, class)
	if capacity != "" {
		s += "          capacity: {requests: " + capacity + "}\n"
	}
	return s + "---\n"
}

// kueueJob is a Job of pods pods (parallelism and completions) in a
// LocalQueue, each pod testenv.ClaimPod's with a claim from template.
func kueueJob(name, queue, template string, pods int) string {
	_, podSpec, _ := strings.Cut(testenv.ClaimPod(name, namespace, "gpu", template), "\nspec:\n")
	return fmt.Sprintf(`apiVersion: batch/v1
kind: Job
metadata:
  name: %[1]s
  namespace: %[2]s
  labels: {kueue.x-k8s.io/queue-name: %[3]s, facet.dev/e2e-kueue: "true"}
spec:
  parallelism: %[4]d
  completions: %[4]d
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
%[5]s`, name, namespace, queue, pods, regexp.MustCompile(`(?m)^`).ReplaceAllString(podSpec, "    "))
}

// admitsQuota makes jobs one-pod Jobs <template>-1, -2, ... in the
// LocalQueue queue, each pod with a claim from template, and waits until
// quota of them are admitted and their pods Running, and the others are
// held for want of res with no pods. Which are held is Kueue's choice
// (equal creation seconds). It returns the admitted and the held, sorted.
func admitsQuota(t *testing.T, queue, template, res string, quota, jobs int) (admitted, held []string) {
	t.Helper()
	for i := 1; i <= jobs; i++ {
		applyYAML(t, kueueJob(fmt.Sprintf("%s-%d", template, i), queue, template, 1))
	}
	waitAdmittedCount(t, template+"-", quota, jobs-quota, fmt.Sprintf("insufficient unused quota for %s in flavor default, 1 more needed", res))
	admitted, held = splitAdmitted(t, template+"-")
	for _, j := range admitted {
		waitJobPodsRunning(t, j, 1)
	}
	for _, j := range held {
		if n := jobPods(t, j); n != 0 {
			t.Fatalf("%s is not admitted but has %d pods", j, n)
		}
	}
	return admitted, held
}

// workloads are Kueue's Workloads, one per Job or pod it manages.
var workloads = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "workloads"}

// kueueClient reads Kueue's objects.
var kueueClient = sync.OnceValue(func() dynamic.Interface {
	cfg, err := clientcmd.BuildConfigFromFlags("", e.kubeconfig)
	if err != nil {
		panic(err)
	}
	return dynamic.NewForConfigOrDie(cfg)
})

type workloadState struct {
	admitted bool
	message  string
}

// workloadStates are the namespace's Workloads by the name of the Job or
// pod that owns them.
func workloadStates(t testing.TB) map[string]workloadState {
	t.Helper()
	var list struct {
		Items []struct {
			Metadata struct {
				OwnerReferences []struct{ Name string } `json:"ownerReferences"`
			} `json:"metadata"`
			Status struct {
				Conditions []struct{ Type, Status, Message string } `json:"conditions"`
			} `json:"status"`
		} `json:"items"`
	}
	// The dynamic client, not kubectl: freeQuota polls this.
	l, err := kueueClient().Resource(workloads).Namespace(namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	out := map[string]workloadState{}
	for _, w := range list.Items {
		if len(w.Metadata.OwnerReferences) == 0 {
			continue
		}
		var s workloadState
		for _, c := range w.Status.Conditions {
			switch {
			case c.Type == "Admitted" && c.Status == "True":
				s.admitted = true
			case c.Type == "QuotaReserved" && c.Status == "False":
				s.message = c.Message
			}
		}
		out[w.Metadata.OwnerReferences[0].Name] = s
	}
	return out
}

// waitWorkloads waits until each named Job's Workload is admitted or not
// as wanted, those not admitted with pending in their message.
func waitWorkloads(t testing.TB, want map[string]bool, pending string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("Workloads %v", want), 2*time.Minute, func() (bool, error) {
		got := workloadStates(t)
		for j, adm := range want {
			s, ok := got[j]
			if !ok || s.admitted != adm || (!adm && !strings.Contains(s.message, pending)) {
				return false, fmt.Errorf("%s: %+v (present %v)", j, s, ok)
			}
		}
		return true, nil
	})
}

// splitAdmitted returns the Jobs named prefix* whose Workloads are
// admitted, and those that are not, each sorted.
func splitAdmitted(t testing.TB, prefix string) (admitted, held []string) {
	t.Helper()
	for j, s := range workloadStates(t) {
		switch {
		case !strings.HasPrefix(j, prefix):
		case s.admitted:
			admitted = append(admitted, j)
		default:
			held = append(held, j)
		}
	}
	sort.Strings(admitted)
	sort.Strings(held)
	return admitted, held
}

// waitAdmittedCount waits until, of the Jobs named prefix*, admitted are
// admitted and held wait with pending in their message.
func waitAdmittedCount(t testing.TB, prefix string, admitted, held int, pending string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d %s* Jobs admitted, %d held", admitted, prefix, held), 2*time.Minute, func() (bool, error) {
		a, h := 0, 0
		var msgs []string
		for j, s := range workloadStates(t) {
			if !strings.HasPrefix(j, prefix) {
				continue
			}
			switch {
			case s.admitted:
				a++
			case strings.Contains(s.message, pending):
				h++
			default:
				msgs = append(msgs, j+": "+s.message)
			}
		}
		return a == admitted && h == held, fmt.Errorf("%d admitted, %d held; others %v", a, h, msgs)
	})
}

// freeQuota deletes the Job freed, whose quota the admission of the Job
// waiting (of pods pods) waits for, and says how long after the deletion
// freed's pods and Workload were gone, and waiting was admitted and all
// its pods Running: the steps, polled, to within a poll (250 ms and a
// List or two).
func freeQuota(t testing.TB, freed, waiting string, pods int) string {
	t.Helper()
	start := time.Now()
	kubectl(t, "delete", "job", freed, "-n", namespace, "--cascade=foreground", "--wait=false")
	var podsGone, workloadGone, admitted time.Duration
	since := func(d *time.Duration) {
		if *d == 0 {
			*d = time.Since(start)
		}
	}
	waitFor(t, fmt.Sprintf("%s deleted, %s admitted and Running", freed, waiting), 3*time.Minute, func() (bool, error) {
		if jobPods(t, freed) == 0 {
			since(&podsGone)
		}
		states := workloadStates(t)
		if _, ok := states[freed]; !ok {
			since(&workloadGone)
		}
		if !states[waiting].admitted {
			return false, fmt.Errorf("%s not admitted: %s", waiting, states[waiting].message)
		}
		since(&admitted)
		running, _, err := jobPodsRunning(waiting)
		return err == nil && running == pods, fmt.Errorf("%d of %d pods of %s Running (%v)", running, pods, waiting, err)
	})
	ms := func(d time.Duration) string {
		if d == 0 {
			return "not seen"
		}
		return d.Round(100 * time.Millisecond).String()
	}
	return fmt.Sprintf("Job %s deleted at 0; its pods gone %s, its Workload gone %s; Job %s admitted %s, its %d pods Running %s",
		freed, ms(podsGone), ms(workloadGone), waiting, ms(admitted), pods, ms(time.Since(start)))
}

func jobPods(t testing.TB, job string) int {
	t.Helper()
	l, err := e.client.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "job-name=" + job})
	if err != nil {
		t.Fatal(err)
	}
	return len(l.Items)
}

// jobClaims counts the claims made for the Job's pods (named after them).
func jobClaims(t testing.TB, job string) int {
	t.Helper()
	l, err := e.client.ResourceV1().ResourceClaims(namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range l.Items {
		if strings.HasPrefix(c.Name, job+"-") {
			n++
		}
	}
	return n
}

func waitJobPodsRunning(t testing.TB, job string, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d pods of Job %s Running", n, job), 3*time.Minute, func() (bool, error) {
		running, all, err := jobPodsRunning(job)
		return err == nil && running == n, fmt.Errorf("%d of %d pods Running (%v)", running, all, err)
	})
}

// jobPodsRunning counts the Job's pods, and those Running.
func jobPodsRunning(job string) (running, all int, err error) {
	l, err := e.client.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "job-name=" + job})
	if err != nil {
		return 0, 0, err
	}
	for _, p := range l.Items {
		if p.Status.Phase == corev1.PodRunning {
			running++
		}
	}
	return running, len(l.Items), nil
}

// waitUsage waits until a ClusterQueue's admitted usage in flavor default
// is want for every resource named in it ("" for none), and fails the test
// with the last usage seen if it is not within a minute. Kueue writes a
// ClusterQueue's status asynchronously, a reconcile or more after the
// Workload is admitted and its pods run, so a single read can see the
// usage from before (the flake this replaced: "team-a uses 2
// facet.dev/gpu, want 3").
func waitUsage(t testing.TB, cq string, want map[string]string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("ClusterQueue %s to use %v", cq, want), time.Minute, func() (bool, error) {
		out, err := kubectlErr("get", "clusterqueue", cq, "-o", "json")
		if err != nil {
			return false, fmt.Errorf("%v: %s", err, out)
		}
		got, err := flavorUsage(out)
		if err != nil {
			return false, err
		}
		for res, w := range want {
			if got[res] != w {
				return false, fmt.Errorf("uses %v", got)
			}
		}
		return true, nil
	})
}

// flavorUsage is a ClusterQueue's (its JSON's) non-zero admitted usage in
// flavor default, by resource name.
func flavorUsage(cqJSON string) (map[string]string, error) {
	var q struct {
		Status struct {
			FlavorsUsage []struct {
				Name      string
				Resources []struct {
					Name  string
					Total resource.Quantity
				}
			} `json:"flavorsUsage"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(cqJSON), &q); err != nil {
		return nil, err
	}
	got := map[string]string{}
	for _, f := range q.Status.FlavorsUsage {
		if f.Name != "default" {
			continue
		}
		for _, r := range f.Resources {
			if !r.Total.IsZero() {
				got[r.Name] = r.Total.String()
			}
		}
	}
	return got, nil
}

// deleteJobs deletes the Jobs named prefix* and waits for their pods to
// go, so that the next subtest finds the GPUs free.
func deleteJobs(t testing.TB, prefix string) {
	t.Helper()
	l, err := e.client.BatchV1().Jobs(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "facet.dev/e2e-kueue=true"})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range l.Items {
		if strings.HasPrefix(j.Name, prefix) {
			_, _ = kubectlErr("delete", "job", j.Name, "-n", namespace, "--cascade=foreground", "--wait=false")
		}
	}
	waitFor(t, "the pods of Jobs "+prefix+"* gone", 3*time.Minute, func() (bool, error) {
		pods, err := e.client.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "job-name"})
		if err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			if strings.HasPrefix(p.Labels["job-name"], prefix) {
				return false, fmt.Errorf("pod %s still there", p.Name)
			}
		}
		return true, nil
	})
}
