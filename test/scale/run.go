package scale

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// Params are one measurement.
type Params struct {
	Shape   Shape
	Nodes   int
	Pods    int
	Classes []*resourceapi.DeviceClass
	// QPS and Burst of the scheduler's client (0: its defaults).
	QPS, Burst int
	// Timeout bounds the wait for bindings, counted from the first pod's
	// creation.
	Timeout time.Duration
	// Log receives progress lines.
	Log func(format string, args ...any)
}

// Result is what one measurement found.
type Result struct {
	Nodes, Pods, Bound int
	// PodsPerSecond is bound pods over the time from the first pod's
	// creation to the last binding.
	PodsPerSecond float64
	// P50 and P99 of creation-to-binding latency over the bound pods.
	P50, P99 time.Duration
	// Elapsed is from the first pod's creation to the last binding (or to
	// the timeout).
	Elapsed time.Duration
	// SlicesPerNode and Setup (nodes and slices created, scheduler ready).
	SlicesPerNode int
	Setup         time.Duration
	// GPUsUsed is how many distinct GPUs the bound claims landed on, and
	// GPUsMin how many they would fill if each node packed its claims
	// onto as few GPUs as possible (PerNode/GPUs claims per GPU).
	GPUsUsed, GPUsMin int
	// FilterPerNode is the DynamicResources plugin's mean Filter time per
	// node (from the scheduler's sampled plugin metrics; 0 if none).
	FilterPerNode time.Duration
	// FilterPerPod is the mean wall time of the Filter extension point of
	// one scheduling attempt (all nodes, in parallel; not sampled).
	FilterPerPod time.Duration
	// CPU is where the machine's CPU went from the first pod's creation
	// to the end of the wait.
	CPU CPUUse
}

// Run populates a started cluster (nodes, slices, classes), starts the
// scheduler, creates every claim and then every pod at once, and measures
// until all pods are bound or Timeout passes.
func Run(ctx context.Context, c *Cluster, p Params) (Result, error) {
	logf := p.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	res := Result{Nodes: p.Nodes, Pods: p.Pods}
	setup := time.Now()
	cs := c.Client
	if _, err := cs.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		return res, fmt.Errorf("service account: %w", err)
	}
	for _, dc := range slices.Concat(p.Classes, p.Shape.Classes) {
		dc = dc.DeepCopy()
		dc.ResourceVersion = ""
		if _, err := cs.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); err != nil {
			return res, fmt.Errorf("device class %s: %w", dc.Name, err)
		}
	}
	res.SlicesPerNode = len(p.Shape.Node("probe"))
	err := parallel(ctx, 32, p.Nodes, func(i int) error {
		name := NodeName(i)
		if _, err := cs.CoreV1().Nodes().Create(ctx, node(name), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("node %s: %w", name, err)
		}
		// The apiserver's TaintNodesByCondition admission adds the
		// not-ready taint on create; no node-lifecycle controller or
		// kubelet will take it away.
		if _, err := cs.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, []byte(`{"spec":{"taints":null}}`), metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("node %s: untaint: %w", name, err)
		}
		for _, s := range p.Shape.Node(name) {
			if _, err := cs.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("slice %s: %w", s.Name, err)
			}
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	logf("%d nodes and %d slices in %s", p.Nodes, p.Nodes*res.SlicesPerNode, time.Since(setup).Round(time.Millisecond))
	err = parallel(ctx, 32, p.Pods, func(i int) error {
		_, err := cs.ResourceV1().ResourceClaims("default").Create(ctx, p.Shape.Claim(podName(i)), metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return res, fmt.Errorf("claims: %w", err)
	}
	if err := c.StartScheduler(ctx, p.QPS, p.Burst); err != nil {
		return res, err
	}
	res.Setup = time.Since(setup)
	logf("claims created, scheduler ready: setup %s", res.Setup.Round(time.Millisecond))

	// Watch bindings before creating pods.
	var mu sync.Mutex
	created := make([]time.Time, p.Pods)
	bound := make([]time.Time, p.Pods)
	nbound := 0
	all := make(chan struct{})
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace("default"))
	inf := factory.Core().V1().Pods().Informer()
	seen := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok || pod.Spec.NodeName == "" {
			return
		}
		now := time.Now()
		i, err := strconv.Atoi(strings.TrimPrefix(pod.Name, "pod-"))
		if err != nil || i < 0 || i >= p.Pods {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if bound[i].IsZero() {
			bound[i] = now
			nbound++
			if nbound == p.Pods {
				close(all)
			}
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: seen, UpdateFunc: func(_, n any) { seen(n) }}); err != nil {
		return res, err
	}
	stop := make(chan struct{})
	defer close(stop)
	factory.Start(stop)
	factory.WaitForCacheSync(stop)

	cpu0 := c.sampleCPU()
	start := time.Now()
	go func() {
		err := parallel(ctx, 64, p.Pods, func(i int) error {
			mu.Lock()
			created[i] = time.Now()
			mu.Unlock()
			_, err := cs.CoreV1().Pods("default").Create(ctx, pod(podName(i)), metav1.CreateOptions{})
			return err
		})
		if err != nil {
			logf("creating pods: %v", err)
		} else {
			logf("%d pods created in %s", p.Pods, time.Since(start).Round(time.Millisecond))
		}
	}()
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	timeout := time.After(p.Timeout)
wait:
	for {
		select {
		case <-all:
			break wait
		case <-timeout:
			break wait
		case <-ctx.Done():
			return res, ctx.Err()
		case <-tick.C:
			mu.Lock()
			logf("%d/%d bound after %s", nbound, p.Pods, time.Since(start).Round(time.Second))
			mu.Unlock()
		}
	}
	res.CPU = c.sampleCPU().since(cpu0)
	mu.Lock()
	defer mu.Unlock()
	if nbound < p.Pods {
		for i := range bound {
			if bound[i].IsZero() {
				logf("%s not bound: %s", podName(i), why(ctx, c, podName(i)))
				break
			}
		}
	}
	var lat []time.Duration
	last := start
	for i := range bound {
		if bound[i].IsZero() {
			continue
		}
		lat = append(lat, bound[i].Sub(created[i]))
		if bound[i].After(last) {
			last = bound[i]
		}
	}
	res.Bound = len(lat)
	if res.Bound == p.Pods {
		res.Elapsed = last.Sub(start)
	} else {
		res.Elapsed = time.Since(start)
	}
	if res.Elapsed > 0 {
		res.PodsPerSecond = float64(res.Bound) / res.Elapsed.Seconds()
	}
	slices.Sort(lat)
	res.P50, res.P99 = quantile(lat, 0.50), quantile(lat, 0.99)
	res.GPUsUsed, res.GPUsMin, err = packing(ctx, c, p.Shape)
	if err != nil {
		logf("packing: %v", err)
	}
	if m, err := c.SchedulerMetrics(); err == nil {
		res.FilterPerNode = meanOf(m, "scheduler_plugin_execution_duration_seconds", `plugin="DynamicResources"`, `extension_point="Filter"`)
		res.FilterPerPod = meanOf(m, "scheduler_framework_extension_point_duration_seconds", `extension_point="Filter"`)
	}
	return res, nil
}

// packing counts the GPUs the allocated claims use, per node, against the
// fewest that could hold them.
func packing(ctx context.Context, c *Cluster, shape Shape) (used, least int, err error) {
	claims, err := c.Client.ResourceV1().ResourceClaims("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, 0, err
	}
	perGPU := max(shape.PerNode/GPUsPerNode, 1)
	gpus := map[string]map[string]bool{} // pool (node) -> GPUs
	count := map[string]int{}
	for _, cl := range claims.Items {
		if cl.Status.Allocation == nil {
			continue
		}
		for _, r := range cl.Status.Allocation.Devices.Results {
			gpu, _, _ := strings.Cut(strings.TrimPrefix(r.Device, "gpu-"), "-")
			if gpus[r.Pool] == nil {
				gpus[r.Pool] = map[string]bool{}
			}
			gpus[r.Pool][gpu] = true
			count[r.Pool]++
		}
	}
	for pool, g := range gpus {
		used += len(g)
		least += (count[pool] + perGPU - 1) / perGPU
	}
	return used, least, nil
}

// why is the PodScheduled condition of an unbound pod.
func why(ctx context.Context, c *Cluster, name string) string {
	pod, err := c.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	for _, cond := range pod.Status.Conditions {
		if cond.Type == corev1.PodScheduled {
			return fmt.Sprintf("%s %s: %s", cond.Status, cond.Reason, cond.Message)
		}
	}
	return "no PodScheduled condition"
}

// NodeName is the name of node i.
func NodeName(i int) string { return fmt.Sprintf("node-%04d", i) }

func podName(i int) string { return fmt.Sprintf("pod-%d", i) }

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// node is a bare Node: no kubelet ever reports on it; its status fits any
// pod here.
func node(name string) *corev1.Node {
	caps := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("224"),
		corev1.ResourceMemory: resource.MustParse("2Ti"),
		corev1.ResourcePods:   resource.MustParse("500"),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}},
		Status: corev1.NodeStatus{
			Capacity: caps, Allocatable: caps,
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
			Phase:      corev1.NodeRunning,
		},
	}
}

// pod is a pod with one claim, pod-<i> with claim pod-<i>.
func pod(name string) *corev1.Pod {
	no := false
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: &no,
			ResourceClaims:               []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &name}},
			Containers: []corev1.Container{{
				Name: "c", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
			}},
		},
	}
}

// parallel runs f(0..n-1) on workers goroutines and returns the first error.
func parallel(ctx context.Context, workers, n int, f func(i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan int)
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					once.Do(func() { first = err; cancel() })
				}
			}
		}()
	}
feed:
	for i := 0; i < n; i++ {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	return first
}

// meanOf reads the mean (sum over count) of the histogram name, over the
// series whose labels contain every one of labels, from metrics text.
func meanOf(metrics, name string, labels ...string) time.Duration {
	var sum, count float64
	for _, line := range strings.Split(metrics, "\n") {
		isSum, isCount := strings.HasPrefix(line, name+"_sum{"), strings.HasPrefix(line, name+"_count{")
		if !isSum && !isCount {
			continue
		}
		match := true
		for _, l := range labels {
			match = match && strings.Contains(line, l)
		}
		f := strings.Fields(line)
		if !match || len(f) < 2 {
			continue
		}
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			continue
		}
		if isSum {
			sum += v
		} else {
			count += v
		}
	}
	if count == 0 {
		return 0
	}
	return time.Duration(sum / count * float64(time.Second))
}
