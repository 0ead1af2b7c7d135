package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/driver"
	"github.com/facet-gpu/facet/pkg/mps"
	"github.com/facet-gpu/facet/pkg/names"
)

// mpsFlags configure MPS partitioning of vGPU shares and slots (package mps).
type mpsFlags struct {
	mode       string
	dir        string
	privateShm bool
	checkEvery time.Duration
}

// open starts the MPS manager; nil and the reason when MPS is off or the
// driver root has no control program (shares are then time-sliced). An
// invalid --mps fails the start (fatal).
func (m *mpsFlags) open(ctx context.Context, driverRoot string) (mgr *mps.Manager, reason, fatal error) {
	logger := klog.FromContext(ctx)
	switch m.mode {
	case "auto", "off":
	default:
		return nil, nil, fmt.Errorf("--mps=%q: want auto or off", m.mode)
	}
	if m.mode == "off" {
		logger.Info("MPS partitioning off (--mps=off): vGPU shares are time-sliced by HAMi-core")
		return nil, fmt.Errorf("--mps=off"), nil
	}
	control, libs, err := mps.FindControl(driverRoot)
	if err != nil {
		logger.Error(err, "MPS unavailable: vGPU shares are time-sliced by HAMi-core")
		return nil, err, nil
	}
	boot, _ := os.ReadFile(driver.DefaultBootIDPath)
	mgr, err = mps.New(mps.Options{Control: control, LibraryPath: libs, Dir: m.dir, BootID: strings.TrimSpace(string(boot)), PrivateShm: m.privateShm})
	if err != nil {
		logger.Error(err, "MPS unavailable: vGPU shares are time-sliced by HAMi-core")
		return nil, err, nil
	}
	logger.Info("MPS partitions vGPU shares and slots by default", "control", control, "dir", m.dir)
	return mgr, nil, nil
}

// partitioning is the node's default, as its shares' attribute says.
func partitioning(m *mps.Manager) string {
	if m == nil {
		return names.PartitioningTimeSliced
	}
	return names.PartitioningMPS
}
