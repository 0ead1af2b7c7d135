package plugin

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/driver"
	"github.com/facet-gpu/facet/pkg/mps"
	"github.com/facet-gpu/facet/pkg/names"
)

// MPSConfig configures MPS partitioning of vGPU shares and slots (package mps).
type MPSConfig struct {
	// Mode is auto or off (--mps).
	Mode string
	// Dir is the host directory of the per-GPU pipe, log and shm directories (--mps-dir).
	Dir string
	// PrivateShm starts each daemon with the GPU's shm directory as /dev/shm (--mps-private-shm).
	PrivateShm bool
	// CheckEvery is how often daemons are checked and dead ones restarted (--mps-check-interval).
	CheckEvery time.Duration
}

// open starts the MPS manager; nil and the reason when MPS is off or the
// driver root has no control program (shares are then time-sliced). An
// invalid --mps fails the start (fatal).
func (m *MPSConfig) open(ctx context.Context, driverRoot string) (mgr *mps.Manager, reason, fatal error) {
	logger := klog.FromContext(ctx)
	switch m.Mode {
	case "auto", "off":
	default:
		return nil, nil, fmt.Errorf("--mps=%q: want auto or off", m.Mode)
	}
	if m.Mode == "off" {
		logger.Info("MPS partitioning off (--mps=off): vGPU shares are time-sliced by HAMi-core")
		return nil, fmt.Errorf("--mps=off"), nil
	}
	control, libs, err := mps.FindControl(driverRoot)
	if err != nil {
		logger.Error(err, "MPS unavailable: vGPU shares are time-sliced by HAMi-core")
		return nil, err, nil
	}
	boot, _ := os.ReadFile(driver.DefaultBootIDPath)
	mgr, err = mps.New(mps.Options{Control: control, LibraryPath: libs, Dir: m.Dir, BootID: strings.TrimSpace(string(boot)), PrivateShm: m.PrivateShm})
	if err != nil {
		logger.Error(err, "MPS unavailable: vGPU shares are time-sliced by HAMi-core")
		return nil, err, nil
	}
	logger.Info("MPS partitions vGPU shares and slots by default", "control", control, "dir", m.Dir)
	return mgr, nil, nil
}

// podGetter reads a claim's pods for the UID they run as (MPS serves one
// UID per GPU): one GET per prepare of an MPS-partitioned claim, which
// the kubelet makes once per claim and node.
func podGetter(client kubernetes.Interface) driver.PodGetter {
	return func(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
		return client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	}
}

// partitioning is the node's default, as its shares' attribute says.
func partitioning(m *mps.Manager) string {
	if m == nil {
		return names.PartitioningTimeSliced
	}
	return names.PartitioningMPS
}
