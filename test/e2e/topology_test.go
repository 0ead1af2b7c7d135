package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/facet-gpu/facet/internal/testenv"
)

// TestTopology runs demo/topology's claims on a simulated HGX H100 node
// (demo/machines/hgx-h100.yaml: eight GPUs on one NVSwitch fabric, two per
// PCIe switch), through the live scheduler and kubelet, in exclusive mode,
// which every round serves: each pod runs, and its container sees GPUs
// whose published topology attributes are the ones its claim aligned on.
func TestTopology(t *testing.T) {
	setupNamespace(t)
	// Another machine than the other tests': the simulated NVML's state
	// of theirs (dgx-h100) would be refused. Their claims are gone with
	// their namespaces, and their plugins with their tests.
	for _, f := range []string{"simulated-nvml.json", "mig-layouts.json"} {
		if err := os.Remove(filepath.Join(e.runDir, "facet-state", f)); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	p := startPlugin(t, "hgx-h100", "--mode", "exclusive")
	t.Cleanup(resetSimulatedGPUs(t, p))
	deleteNamespaceAtEnd(t)
	waitModes(t, func(int64) string { return "exclusive" })

	// attrs are each published GPU's topology attributes, by UUID.
	attrs := map[string]map[string]string{}
	for _, s := range ourSlices(t) {
		for _, d := range s.Spec.Devices {
			a := map[string]string{}
			for _, k := range []string{"nvlinkDomain", "pcieSwitch"} {
				if v, ok := d.Attributes[resourceapi.QualifiedName(k)]; ok && v.StringValue != nil {
					a[k] = *v.StringValue
				}
			}
			attrs[*d.Attributes["uuid"].StringValue] = a
		}
	}
	for _, tc := range []struct{ file, template, attr string }{
		{"two-gpus-one-nvlink-domain.yaml", "two-gpus-one-nvlink-domain", "nvlinkDomain"},
		{"pair-one-pcie-switch.yaml", "pair-one-pcie-switch", "pcieSwitch"},
	} {
		t.Run(tc.template, func(t *testing.T) {
			kubectl(t, "apply", "-f", filepath.Join(e.repo, "demo", "topology", tc.file))
			applyYAML(t, testenv.ClaimPod(tc.template, namespace, "gpus", tc.template))
			waitPodRunning(t, tc.template)
			uuids := strings.Split(envOf(execIn(t, tc.template, "", "env"))["FACET_GPU_UUIDS"], ",")
			if len(uuids) != 2 {
				t.Fatalf("the container sees GPUs %v, want two", uuids)
			}
			a, b := attrs[uuids[0]][tc.attr], attrs[uuids[1]][tc.attr]
			if a == "" || a != b {
				t.Errorf("GPUs %v have %s %q and %q, want one value", uuids, tc.attr, a, b)
			}
			t.Logf("%s: GPUs %v, %s %s", tc.template, uuids, tc.attr, a)
			kubectl(t, "delete", "pod", "-n", namespace, tc.template, "--wait=true", "--timeout=120s")
		})
	}

	// A GPU and a NIC of a second DRA driver on one PCIe root: the
	// stand-in NIC driver offers one NIC, under the third root complex
	// (GPUs 4 and 5), so the claim's GPU must be one of those.
	t.Run("gpu-and-nic", func(t *testing.T) {
		roots := map[string]string{}
		for _, s := range ourSlices(t) {
			for _, d := range s.Spec.Devices {
				if v, ok := d.Attributes["resource.kubernetes.io/pcieRoot"]; ok && v.StringValue != nil {
					roots[*d.Attributes["uuid"].StringValue] = *v.StringValue
				}
			}
		}
		const nicRoot = "pci0000:95"
		startNICDriver(t, nicRoot)
		kubectl(t, "apply", "-f", filepath.Join(e.repo, "demo", "topology", "gpu-and-nic.yaml"))
		t.Cleanup(func() { _, _ = kubectlErr("delete", "deviceclass", nicDriverName, "--ignore-not-found") })
		applyYAML(t, testenv.ClaimPod("gpu-and-nic", namespace, "both", "gpu-and-nic"))
		pod := waitPodRunning(t, "gpu-and-nic")
		uuids := envOf(execIn(t, "gpu-and-nic", "", "env"))["FACET_GPU_UUIDS"]
		if roots[uuids] != nicRoot {
			t.Errorf("the container sees GPU %q on root %q, want one on the NIC's root %s", uuids, roots[uuids], nicRoot)
		}
		for _, c := range podClaims(t, pod) {
			for _, r := range c.Status.Allocation.Devices.Results {
				t.Logf("allocated %s: %s/%s", r.Request, r.Driver, r.Device)
			}
		}
		kubectl(t, "delete", "pod", "-n", namespace, "gpu-and-nic", "--wait=true", "--timeout=120s")
	})
}

// nicDriver is a stand-in second DRA driver, nic.example.com: a kubelet
// plugin (k8s.io/dynamic-resource-allocation/kubeletplugin, as Facet's)
// that publishes NICs with the standard resource.kubernetes.io/pcieRoot
// and prepares them with no CDI device, so that a claim can align a GPU
// with a NIC through the live scheduler and kubelet.
type nicDriver struct{}

func (nicDriver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		var devs []kubeletplugin.Device
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == nicDriverName {
				devs = append(devs, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device})
			}
		}
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devs}
	}
	return out, nil
}

func (nicDriver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, c := range claims {
		out[c.UID] = nil
	}
	return out, nil
}

func (nicDriver) HandleError(context.Context, error, string) {}

const nicDriverName = "nic.example.com"

// startNICDriver runs nicDriver for the node until t ends, with one NIC on
// each of roots.
func startNICDriver(t *testing.T, roots ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	dir := filepath.Join(e.kubeletRoot, "plugins", nicDriverName)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	helper, err := kubeletplugin.Start(ctx, nicDriver{},
		kubeletplugin.DriverName(nicDriverName),
		kubeletplugin.NodeName(nodeName),
		kubeletplugin.KubeClient(e.client),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(e.kubeletRoot, "plugins_registry")),
		kubeletplugin.PluginDataDirectoryPath(dir),
	)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var devs []resourceapi.Device
	for i, r := range roots {
		devs = append(devs, resourceapi.Device{Name: fmt.Sprintf("nic-%d", i), Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"resource.kubernetes.io/pcieRoot": {StringValue: &r},
		}})
	}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{nodeName: {Slices: []resourceslice.Slice{{Devices: devs}}}}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		helper.Stop()
		cancel()
		_, _ = kubectlErr("delete", "resourceslices", "--field-selector", "spec.driver="+nicDriverName)
	})
	waitFor(t, "the stand-in NIC driver registered and its slice published", time.Minute, func() (bool, error) {
		st := helper.RegistrationStatus()
		if st == nil || !st.PluginRegistered {
			return false, fmt.Errorf("registration %+v", st)
		}
		sl, err := e.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: "spec.driver=" + nicDriverName})
		return err == nil && len(sl.Items) == 1, fmt.Errorf("%v slices, %v", len(sl.Items), err)
	})
}
