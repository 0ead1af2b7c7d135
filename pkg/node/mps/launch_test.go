package mps

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/facet-gpu/facet/internal/mps/mpssim"
)

// TestLaunchBindsSourcesItsMountsCover: the launcher binds the GPU's
// directories into the root it chroots into wherever they lie, also under
// a path that its own mounts cover. Seen on a real H200: `facetctl
// node-check --driver-root /` as docs/node-check.md runs it, its scratch
// directory under /tmp, failed every MPS prepare with "bind
// /tmp/facet-node-check-…/mps/GPU-…/pipe on /tmp/nvidia-mps: no such file
// or directory": the launcher's tmpfs over the root's /tmp had hidden the
// pipe directory it was about to bind.
func TestLaunchBindsSourcesItsMountsCover(t *testing.T) {
	for _, tc := range []struct {
		name string
		// dir is the MPS directory below the driver root; "" is one
		// beside it (a directory of the tests' own).
		dir string
	}{
		{name: "beside the root"},
		{name: "under the root's /tmp (driver root /, scratch in /tmp)", dir: "tmp/facet-node-check-1/mps"},
		{name: "under the root's /dev/shm", dir: "dev/shm/facet-mps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			if tc.dir != "" {
				n.dir = filepath.Join(n.root, tc.dir)
			}
			_, ctx := ktesting.NewTestContext(t)
			m := n.plugin(nil)
			if err := m.Acquire(ctx, gpuA, "claim-1", 0); err != nil {
				t.Fatalf("MPS directory %s: %v", n.dir, err)
			}
			pid := n.pid(gpuA)
			if pid == 0 {
				t.Fatalf("no live daemon named in %s", m.DirsOf(gpuA).Pipe)
			}
			// What the daemon made in its /tmp/nvidia-mps and /dev/shm
			// is in the GPU's directories, as a share's container sees
			// them.
			dirs := m.DirsOf(gpuA)
			for _, p := range []string{filepath.Join(dirs.Pipe, "control"), filepath.Join(dirs.Shm, fmt.Sprintf("%s.%d", mpssim.ShmMarker, pid))} {
				if _, err := os.Stat(p); err != nil {
					t.Errorf("the daemon's file is not in the GPU's directory: %v", err)
				}
			}
			if got := n.log(gpuA, "startup"); len(got) != 1 || !strings.Contains(got[0], "gpu="+gpuA) {
				t.Errorf("startup log %q: want one start for %s", got, gpuA)
			}
			if err := m.Release(ctx, "claim-1"); err != nil {
				t.Fatal(err)
			}
			if n.pid(gpuA) != 0 || len(n.log(gpuA, "quit")) != 1 {
				t.Errorf("after the last claim: daemon %d, quit log %q; want it stopped by quit", n.pid(gpuA), n.log(gpuA, "quit"))
			}
		})
	}
}
