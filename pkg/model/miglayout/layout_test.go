package miglayout

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// gpuOf simulates one GPU of a model as an admin leaves it for MIG: MIG
// mode off from Hopper on (Facet turns it on), on before Hopper, whose
// MIG mode Facet does not change (nvmlgpu.GPU.MIGModeFixed).
func gpuOf(t *testing.T, model string) (*nvmlgpu.Library, nvmlgpu.GPU) {
	t.Helper()
	lib, g := gpuBooted(t, model, false)
	if g.MIGModeFixed != "" {
		lib.Close()
		lib, g = gpuBooted(t, model, true)
	}
	return lib, g
}

// gpuBooted simulates one GPU of a model with MIG mode on or off at boot.
func gpuBooted(t *testing.T, model string, migEnabled bool) (*nvmlgpu.Library, nvmlgpu.GPU) {
	t.Helper()
	lib, err := sim.OpenSimulated(&sim.Machine{Name: "layout-test", DriverVersion: "580.159.04", CUDADriverVersion: "13.0",
		GPUs: []sim.MachineGPU{{Model: model, MIGEnabled: migEnabled}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lib.Close() })
	node, err := lib.Discover()
	if err != nil {
		t.Fatal(err)
	}
	return lib, node.GPUs[0]
}

func summary(plan []Instance) string {
	var parts []string
	for _, p := range plan {
		parts = append(parts, fmt.Sprintf("%s@%d", p.Profile.Name, p.Placement.Start))
	}
	return strings.Join(parts, " ")
}

// TestPlan: mig-parted's layouts on every MIG model; the simulated GPU
// (go-nvml's mock tables, corrected to NVIDIA's MIG user guide) then
// creates every planned set, so a plan is one the hardware accepts.
func TestPlan(t *testing.T) {
	tests := []struct {
		model, layout, want, wantErr string
	}{
		{model: "H100-SXM5-80GB", layout: "all-1g.10gb", want: "1g.10gb@0 1g.10gb@1 1g.10gb@2 1g.10gb@3 1g.10gb@4 1g.10gb@5 1g.10gb@6"},
		{model: "H100-SXM5-80GB", layout: "all-3g.40gb", want: "3g.40gb@0 3g.40gb@4"},
		{model: "H100-SXM5-80GB", layout: "all-balanced", want: "2g.20gb@0 1g.10gb@2 1g.10gb@3 3g.40gb@4"},
		{model: "H100-SXM5-80GB", layout: "4g.40gb/2g.20gb/1g.10gb", want: "4g.40gb@0 2g.20gb@4 1g.10gb@6"},
		{model: "H100-SXM5-80GB", layout: "1g.10gb+me/1g.10gb+me", wantErr: "do not fit on the GPU together"},
		{model: "H100-SXM5-80GB", layout: "all-7g.80gb", want: "7g.80gb@0"},
		{model: "H100-SXM5-80GB", layout: "all-1g.5gb", wantErr: `no profile "1g.5gb"`},
		{model: "A100-SXM4-40GB", layout: "all-1g.5gb", want: "1g.5gb@0 1g.5gb@1 1g.5gb@2 1g.5gb@3 1g.5gb@4 1g.5gb@5 1g.5gb@6"},
		{model: "A100-SXM4-40GB", layout: "all-balanced", want: "2g.10gb@0 1g.5gb@2 1g.5gb@3 3g.20gb@4"},
		{model: "A30-PCIE-24GB", layout: "all-balanced", want: "2g.12gb@0 1g.6gb@2 1g.6gb@3"},
		{model: "H200-141GB", layout: "all-1g.18gb", want: "1g.18gb@0 1g.18gb@1 1g.18gb@2 1g.18gb@3 1g.18gb@4 1g.18gb@5 1g.18gb@6"},
		{model: "B200-180GB", layout: "all-balanced"},
	}
	for _, tc := range tests {
		t.Run(tc.model+"/"+tc.layout, func(t *testing.T) {
			lib, g := gpuOf(t, tc.model)
			plan, err := Plan(tc.layout, g.MIGProfiles)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.want != "" && summary(plan) != tc.want {
				t.Errorf("plan %s, want %s", summary(plan), tc.want)
			}
			if _, err := lib.EnableMIG(g.UUID); err != nil {
				t.Fatal(err)
			}
			var ps []nvmlgpu.MIGPlacement
			for _, p := range plan {
				ps = append(ps, nvmlgpu.MIGPlacement{GIProfileID: p.Profile.GIProfileID, Start: p.Placement.Start})
			}
			if ok, err := lib.CanCreateTogether(g.UUID, ps); err != nil || !ok {
				t.Errorf("NVML refuses the plan %s: %v %v", summary(plan), ok, err)
			}
		})
	}
}

func TestApply(t *testing.T) {
	lib, g := gpuOf(t, "H100-SXM5-80GB")
	store := NewStore(filepath.Join(t.TempDir(), "mig-layouts.json"))
	list := func() []nvmlgpu.MIGInstance {
		t.Helper()
		all, err := lib.ListMIG()
		if err != nil {
			t.Fatal(err)
		}
		return all
	}
	step := func(layout string, busy, wantChanged bool, wantNote string, wantCount int) {
		t.Helper()
		out, err := Apply(lib, store, g, layout, list(), busy)
		if err != nil {
			t.Fatalf("%s: %v", layout, err)
		}
		if out.Changed != wantChanged || !strings.Contains(out.Note, wantNote) || (wantNote == "") != (out.Note == "") {
			t.Errorf("%s: outcome %+v, want changed %v note %q", layout, out, wantChanged, wantNote)
		}
		if n := len(list()); n != wantCount {
			t.Errorf("%s: %d instances, want %d", layout, n, wantCount)
		}
	}
	step("all-1g.10gb", false, true, "", 7)
	step("all-1g.10gb", false, false, "", 7) // in place: nothing to do
	step("all-3g.40gb", true, false, "claims are prepared", 7)
	step("all-3g.40gb", false, true, "", 2) // Facet's own instances are replaced
	recs, err := store.Load()
	if err != nil || len(recs[g.UUID].Instances) != 2 || recs[g.UUID].Layout != "all-3g.40gb" {
		t.Fatalf("records %+v %v", recs, err)
	}

	// An instance Facet did not make stops any change, and survives.
	for _, in := range list() {
		if err := lib.DestroyMIG(g.UUID, in.GIID, in.CIID); err != nil {
			t.Fatal(err)
		}
	}
	foreign, err := lib.CreateMIG(g.UUID, g.MIGProfiles[0].GIProfileID, 6)
	if err != nil {
		t.Fatal(err)
	}
	step("all-balanced", false, false, "did not create", 1)
	if l := list(); len(l) != 1 || l[0].GIID != foreign.GIID {
		t.Errorf("the foreign instance was touched: %+v", l)
	}

	// A corrupt record file: nothing is destroyed.
	if err := os.WriteFile(store.path, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Apply(lib, store, g, "all-balanced", list(), false); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("corrupt records: %v", err)
	}
}

// TestApplyMIGModeFixed: on an A100, whose MIG mode Facet does not change,
// a layout is applied where the admin turned MIG mode on, and refused,
// saying why, where it is off; nothing is created and no mode change is
// left pending.
func TestApplyMIGModeFixed(t *testing.T) {
	lib, g := gpuBooted(t, "A100-SXM4-40GB", false)
	store := NewStore(filepath.Join(t.TempDir(), "mig-layouts.json"))
	out, err := Apply(lib, store, g, "all-balanced", nil, false)
	if !errors.Is(err, nvmlgpu.ErrMIGModeFixed) || !strings.Contains(err.Error(), "MIG layout all-balanced") || out.Changed {
		t.Fatalf("MIG mode off: %+v, %v; want ErrMIGModeFixed", out, err)
	}
	if all, err := lib.ListMIG(); err != nil || len(all) != 0 {
		t.Fatalf("instances %+v, %v", all, err)
	}
	if node, err := lib.Discover(); err != nil || node.GPUs[0].MIGEnabled {
		t.Fatalf("MIG mode changed: %v", err)
	}

	lib, g = gpuBooted(t, "A100-SXM4-40GB", true)
	out, err = Apply(lib, store, g, "all-balanced", nil, false)
	if err != nil || !out.Changed {
		t.Fatalf("MIG mode on: %+v, %v", out, err)
	}
	if all, err := lib.ListMIG(); err != nil || len(all) != 4 {
		t.Fatalf("instances %+v, %v; want all-balanced's 4", all, err)
	}
}
