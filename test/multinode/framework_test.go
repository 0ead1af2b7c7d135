// Package multinode tests Facet on a cluster of several real kubelets on one
// machine (hack/multinode.sh): which node a claim lands on, a claim that fits
// nowhere, spreading, and one node's plugin restart beside the others.
//
// The cluster is up.sh's node "localhost", which has no GPUs, and three nodes
// hack/cluster/add-node.sh added, each with its own fake CRI, kubelet and
// Facet plugin on a simulated machine. The fake CRI runs no containers; its
// log of the CDI device IDs each container was given proves what reached the
// runtime, and on which node.
package multinode

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/facet-gpu/facet/internal/testenv"
	"github.com/facet-gpu/facet/pkg/model/names"
)

// gpuNode is one node hack/multinode.sh adds: its name (the pool's), the
// simulated GPUs' product name, how many, and the mode the plugin runs them in.
type gpuNode struct {
	name, product string
	gpus          int
	mode          string
}

var (
	h100 = gpuNode{name: "node-h100", product: "NVIDIA H100 80GB HBM3", gpus: 8, mode: "mig"}
	a100 = gpuNode{name: "node-a100", product: "NVIDIA A100-SXM4-80GB", gpus: 8, mode: "shared"}
	l4   = gpuNode{name: "node-l4", product: "NVIDIA L4", gpus: 4, mode: "exclusive"}

	gpuNodes = []gpuNode{h100, a100, l4}
)

// cpuNode is up.sh's node: no plugin, no devices.
const cpuNode = "localhost"

// env is the cluster hack/multinode.sh started.
type env struct {
	runDir, binDir, kubeconfig, repo string
	client                           kubernetes.Interface
}

var e env

func TestMain(m *testing.M) {
	e = env{
		runDir:     os.Getenv("FACET_RUN_DIR"),
		binDir:     os.Getenv("FACET_BIN_DIR"),
		kubeconfig: os.Getenv("KUBECONFIG"),
	}
	if e.runDir == "" || e.kubeconfig == "" {
		fmt.Println("SKIP: test/multinode needs the multi-node cluster; run it through `make multinode` (hack/multinode.sh)")
		os.Exit(0)
	}
	// A single-node cluster (up.sh, hack/e2e.sh, the demo) has the same
	// environment but not these nodes.
	for _, n := range gpuNodes {
		if _, err := os.Stat(n.dir()); err != nil {
			fmt.Printf("SKIP: test/multinode needs node %s (%v); run it through `make multinode` (hack/multinode.sh)\n", n.name, err)
			os.Exit(0)
		}
	}
	wd, err := os.Getwd()
	if err != nil {
		panic(err)
	}
	e.repo = filepath.Join(wd, "..", "..")
	cfg, err := clientcmd.BuildConfigFromFlags("", e.kubeconfig)
	if err != nil {
		panic(err)
	}
	e.client = kubernetes.NewForConfigOrDie(cfg)
	os.Exit(m.Run())
}

// dir is the node's directory (hack/cluster/add-node.sh).
func (n gpuNode) dir() string { return filepath.Join(e.runDir, "nodes", n.name) }

// cdiLog is the node's fake CRI log: one JSON line per container created.
func (n gpuNode) cdiLog() string { return filepath.Join(e.runDir, "logs", n.name, "cdi.jsonl") }

// nodeEnv reads one variable of the node's env.sh (export K="V" lines).
func (n gpuNode) nodeEnv(t testing.TB, key string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(n.dir(), "env.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^export ` + regexp.QuoteMeta(key) + `="([^"]*)"$`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("%s: no %s in env.sh", n.name, key)
	}
	return string(m[1])
}

// pluginPID is the pid of the node's running plugin, 0 if none runs.
func (n gpuNode) pluginPID(t testing.TB) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(n.dir(), "pids", "facet-plugin.pid"))
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	if !processRuns(pid) {
		return 0
	}
	return pid
}

// restartPlugin starts the node's plugin again, with the arguments
// add-node.sh gave it (hack/plugin.sh restart), and waits for its /readyz.
func (n gpuNode) restartPlugin(t testing.TB) {
	t.Helper()
	cmd := exec.Command(filepath.Join(e.repo, "hack", "plugin.sh"), "restart", e.runDir)
	cmd.Env = append(os.Environ(), "FACET_NODE="+n.name)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("restarting %s's plugin: %v\n%s", n.name, err, out)
	}
	n.waitPluginReady(t)
}

// waitPluginReady waits until the node's plugin answers /readyz: registered
// with its kubelet, all its slices published.
func (n gpuNode) waitPluginReady(t testing.TB) {
	t.Helper()
	url := "http://" + n.nodeEnv(t, "FACET_PLUGIN_HEALTH_ADDR") + "/readyz"
	client := &http.Client{Timeout: 5 * time.Second}
	waitFor(t, n.name+"'s plugin ready ("+url+")", 2*time.Minute, func() (bool, error) {
		resp, err := client.Get(url)
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Errorf("status %d", resp.StatusCode)
	})
}

// slicesOf lists the node's ResourceSlices of Facet's driver.
func slicesOf(t testing.TB, node string) []resourceapi.ResourceSlice {
	t.Helper()
	sel := fields.Set{"spec.driver": names.Driver, "spec.nodeName": node}.AsSelector().String()
	list, err := e.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func waitFor(t testing.TB, what string, timeout time.Duration, cond func() (bool, error)) {
	t.Helper()
	testenv.WaitFor(t, what, timeout, cond)
}

// newNamespace creates a namespace for t and deletes it when t ends,
// waiting until it is gone: its pods' claims are unprepared by then, and
// the next test starts with free GPUs.
func newNamespace(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	ns, err := e.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "facet-mn-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.client.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting namespace %s: %v", ns.Name, err)
			return
		}
		waitFor(t, "namespace "+ns.Name+" gone", 3*time.Minute, func() (bool, error) {
			_, err := e.client.CoreV1().Namespaces().Get(ctx, ns.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), err
		})
	})
	// Pods are refused until the namespace's default ServiceAccount exists.
	waitFor(t, "default ServiceAccount in "+ns.Name, time.Minute, func() (bool, error) {
		_, err := e.client.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, err
	})
	return ns.Name
}

// request is one device request: a DeviceClass, optional CEL selectors, a
// count (0: one) and optional capacity (a vGPU share).
type request struct {
	class    string
	cel      []string
	count    int64
	capacity map[string]string
}

func (r request) deviceRequest() resourceapi.DeviceRequest {
	ex := &resourceapi.ExactDeviceRequest{DeviceClassName: r.class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}
	if r.count > 0 {
		ex.Count = r.count
	}
	for _, c := range r.cel {
		ex.Selectors = append(ex.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: c}})
	}
	if len(r.capacity) > 0 {
		ex.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
		for k, v := range r.capacity {
			ex.Capacity.Requests[resourceapi.QualifiedName(k)] = resource.MustParse(v)
		}
	}
	return resourceapi.DeviceRequest{Name: "gpu", Exactly: ex}
}

// The claims that only one node's GPUs can serve, by that node's mode or model.
var (
	// A MIG instance: only node-h100 runs its GPUs in mig mode; node-a100's
	// A100s have the 1g.10gb profile too, but in shared mode publish no MIG.
	migRequest = request{class: "mig-1g.10gb.facet.dev"}
	// A vGPU share: only node-a100 runs shared mode.
	shareRequest = request{class: "vgpu.facet.dev", capacity: map[string]string{"memory": "4Gi", "cores": "20"}}
	// A whole GPU chosen by CEL on its product name and memory: an L4.
	l4Request = request{class: "gpu.facet.dev", cel: []string{
		`device.attributes["gpu.facet.dev"].productName == "NVIDIA L4" && ` +
			`device.capacity["gpu.facet.dev"].memory.compareTo(quantity("20Gi")) >= 0`,
	}}
	// landsOn maps each node to a claim that lands there.
	landsOn = map[string]request{h100.name: migRequest, a100.name: shareRequest, l4.name: l4Request}
)

// createPod creates a ResourceClaimTemplate with req and a pod of one
// container that uses the claim made from it; edit, if set, changes the
// pod before it is created.
func createPod(t testing.TB, ns, name string, req request, edit func(*corev1.Pod)) {
	t.Helper()
	ctx := context.Background()
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{
			Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req.deviceRequest()}},
		}},
	}
	if _, err := e.client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name:            "c",
				Image:           "facet.local/busybox:1",
				ImagePullPolicy: corev1.PullNever,
				Command:         []string{"sleep", "86400"},
				Resources:       corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
			}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tmpl.Name}},
		},
	}
	if edit != nil {
		edit(pod)
	}
	if _, err := e.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func getPod(t testing.TB, ns, name string) *corev1.Pod {
	t.Helper()
	pod, err := e.client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

func waitRunning(t testing.TB, ns, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	waitFor(t, "pod "+ns+"/"+name+" Running", 2*time.Minute, func() (bool, error) {
		var err error
		pod, err = e.client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return pod.Status.Phase == corev1.PodRunning, fmt.Errorf("phase %s on %q, conditions %v", pod.Status.Phase, pod.Spec.NodeName, pod.Status.Conditions)
	})
	return pod
}

// podClaim returns the pod's claim "gpu", as the API server holds it now.
func podClaim(t testing.TB, pod *corev1.Pod) *resourceapi.ResourceClaim {
	t.Helper()
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.Name == "gpu" && s.ResourceClaimName != nil {
			c, err := e.client.ResourceV1().ResourceClaims(pod.Namespace).Get(context.Background(), *s.ResourceClaimName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
	}
	t.Fatalf("pod %s has no claim gpu in its status: %+v", pod.Name, pod.Status.ResourceClaimStatuses)
	return nil
}

// checkOn checks that pod runs on node with its claim allocated from that
// node's pool, and that node's kubelet, and no other, handed the claim's
// CDI devices to its runtime. It returns the allocated device names.
func checkOn(t testing.TB, pod *corev1.Pod, node string) []string {
	t.Helper()
	if pod.Spec.NodeName != node {
		t.Errorf("pod %s is on node %q, want %q", pod.Name, pod.Spec.NodeName, node)
	}
	claim := podClaim(t, pod)
	if claim.Status.Allocation == nil {
		t.Fatalf("pod %s: claim %s is not allocated", pod.Name, claim.Name)
	}
	var devices, cdi []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != names.Driver || r.Pool != node {
			t.Errorf("pod %s: claim %s has device %s/%s/%s, want one of pool %s", pod.Name, claim.Name, r.Driver, r.Pool, r.Device, node)
		}
		devices = append(devices, r.Device)
		cdi = append(cdi, names.Driver+"/claim="+string(claim.UID)+"-"+r.Device)
	}
	for _, n := range gpuNodes {
		got := cdiDevicesOf(t, n, pod)
		switch {
		case n.name == node && !containsAll(got, cdi):
			t.Errorf("pod %s: %s's fake CRI got CDI devices %v, want %v", pod.Name, n.name, got, cdi)
		case n.name != node && len(got) > 0:
			t.Errorf("pod %s on %s: %s's fake CRI got CDI devices %v for it too", pod.Name, node, n.name, got)
		}
	}
	return devices
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return len(want) > 0
}

// cdiDevicesOf returns the CDI device IDs node's fake CRI logged for the
// containers of pod (by UID); none if that node never created one.
func cdiDevicesOf(t testing.TB, n gpuNode, pod *corev1.Pod) []string {
	t.Helper()
	f, err := os.Open(n.cdiLog())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		var rec struct {
			PodUID     string   `json:"podUID"`
			CDIDevices []string `json:"cdiDevices"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("%s: %v in %q", n.cdiLog(), err, sc.Text())
		}
		if rec.PodUID == string(pod.UID) {
			out = append(out, rec.CDIDevices...)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
