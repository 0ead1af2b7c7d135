package claimcdi

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/facet-gpu/facet/pkg/node/claimuid"
	"k8s.io/apimachinery/pkg/types"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

const uid = types.UID("4f6c2a7e-0d1b-4c5e-9a3f-1b2c3d4e5f60")

func node(path string) *cdispec.ContainerEdits {
	return &cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{{Path: path}}}
}

// gpu0 is a claim's one device with its device node.
var gpu0 = []Device{{Name: "gpu-0", Edits: node("/dev/nvidia0")}}

func newWriter(t *testing.T) *Writer {
	t.Helper()
	w, err := NewWriter(filepath.Join(t.TempDir(), "cdi"))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func readSpec(t *testing.T, path string) *cdispec.Spec {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatalf("%s: %v\n%s", path, err, data)
	}
	return &spec
}

func TestNames(t *testing.T) {
	for _, tc := range []struct {
		uid    types.UID
		device string
		id     string
		spec   string
	}{
		{uid, "gpu-3", "gpu.facet.dev/claim=" + string(uid) + "-gpu-3", "gpu.facet.dev-claim_" + string(uid)},
		{"u1", "gpu-0-mig-1g10gb-6", "gpu.facet.dev/claim=u1-gpu-0-mig-1g10gb-6", "gpu.facet.dev-claim_u1"},
	} {
		t.Run(tc.device, func(t *testing.T) {
			if got := DeviceID(tc.uid, tc.device); got != tc.id {
				t.Errorf("DeviceID = %q, want %q", got, tc.id)
			}
			if _, _, _, err := parser.ParseQualifiedName(DeviceID(tc.uid, tc.device)); err != nil {
				t.Errorf("DeviceID is not a valid CDI name: %v", err)
			}
			if got := SpecName(tc.uid); got != tc.spec {
				t.Errorf("SpecName = %q, want %q", got, tc.spec)
			}
		})
	}
	if Kind != "gpu.facet.dev/claim" {
		t.Errorf("Kind = %q", Kind)
	}
}

func TestWriteClaim(t *testing.T) {
	for _, tc := range []struct {
		name    string
		common  *cdispec.ContainerEdits
		devices []Device
		wantIDs []string
	}{
		{
			name:    "one whole GPU",
			common:  &cdispec.ContainerEdits{Env: []string{"NVIDIA_VISIBLE_DEVICES=void"}, DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/nvidiactl"}}},
			devices: []Device{{Name: "gpu-3", Edits: node("/dev/nvidia3")}},
			wantIDs: []string{"gpu.facet.dev/claim=" + string(uid) + "-gpu-3"},
		},
		{
			name: "two devices keep their order",
			devices: []Device{
				{Name: "gpu-1", Edits: node("/dev/nvidia1")},
				{Name: "gpu-0-mig-1g10gb-6", Edits: node("/dev/nvidia0")},
			},
			wantIDs: []string{"gpu.facet.dev/claim=" + string(uid) + "-gpu-1", "gpu.facet.dev/claim=" + string(uid) + "-gpu-0-mig-1g10gb-6"},
		},
		{
			name:    "MIG device and claim-wide env",
			common:  &cdispec.ContainerEdits{Env: []string{"CUDA_DEVICE_MEMORY_LIMIT_0=2000m"}},
			devices: []Device{{Name: "gpu-0-mig-3g40gb-4", Edits: &cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/nvidia0"}, {Path: "/dev/nvidia-caps/nvidia-cap21"}}}}},
			wantIDs: []string{"gpu.facet.dev/claim=" + string(uid) + "-gpu-0-mig-3g40gb-4"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWriter(t)
			name, ids, _, err := w.WriteClaim(uid, tc.common, tc.devices)
			if err != nil {
				t.Fatal(err)
			}
			if want := SpecName(uid) + ".json"; name != want {
				t.Errorf("file %q, want %q", name, want)
			}
			if !reflect.DeepEqual(ids, tc.wantIDs) {
				t.Errorf("IDs %v, want %v", ids, tc.wantIDs)
			}
			spec := readSpec(t, filepath.Join(w.Dir(), name))
			if spec.Kind != Kind || spec.Version == "" {
				t.Errorf("kind %q version %q", spec.Kind, spec.Version)
			}
			if tc.common != nil && !reflect.DeepEqual(spec.ContainerEdits, *tc.common) {
				t.Errorf("top-level edits %+v, want %+v", spec.ContainerEdits, *tc.common)
			}
			if len(spec.Devices) != len(tc.devices) {
				t.Fatalf("%d devices, want %d", len(spec.Devices), len(tc.devices))
			}
			for i, d := range tc.devices {
				got := spec.Devices[i]
				if got.Name != string(uid)+"-"+d.Name {
					t.Errorf("device %d named %q", i, got.Name)
				}
				if d.Edits != nil && !reflect.DeepEqual(got.ContainerEdits, *d.Edits) {
					t.Errorf("device %s edits %+v, want %+v", d.Name, got.ContainerEdits, *d.Edits)
				}
			}
			// The runtime's view: a CDI cache on the directory resolves
			// every returned ID.
			cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(w.Dir()), cdiapi.WithAutoRefresh(false))
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range ids {
				if cache.GetDevice(id) == nil {
					t.Errorf("runtime cannot resolve %s (errors: %v)", id, cache.GetErrors())
				}
			}
			if got, err := w.ClaimSpecs(); err != nil || !reflect.DeepEqual(got, []types.UID{uid}) {
				t.Errorf("ClaimSpecs = %v, %v", got, err)
			}
			assertNoTempFiles(t, w.Dir())
		})
	}
}

// assertNoTempFiles fails when anything but Facet's finished specs is in dir.
func assertNoTempFiles(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "gpu.facet.dev-claim_") || !strings.HasSuffix(e.Name(), ".json") {
			t.Errorf("left in %s: %s", dir, e.Name())
		}
	}
}

// TestRewriteIsAtomic rewrites one claim's spec while readers read it: a
// reader sees the old spec or the new one, never a partial file.
func TestRewriteIsAtomic(t *testing.T) {
	w := newWriter(t)
	envs := func(n int) *cdispec.ContainerEdits {
		e := &cdispec.ContainerEdits{}
		// Big enough that a non-atomic write would be seen half done.
		for i := 0; i < 200; i++ {
			e.Env = append(e.Env, fmt.Sprintf("VERSION_%d=%d", i, n))
		}
		return e
	}
	name, _, _, err := w.WriteClaim(uid, envs(0), gpu0)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(w.Dir(), name)
	const writes = 50
	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				data, err := os.ReadFile(path)
				if err != nil {
					errs <- fmt.Errorf("read: %w", err)
					return
				}
				var spec cdispec.Spec
				if err := json.Unmarshal(data, &spec); err != nil || len(spec.ContainerEdits.Env) != 200 {
					errs <- fmt.Errorf("partial spec seen (%v, %d bytes)", err, len(data))
					return
				}
			}
		}()
	}
	// The readers stop however the test ends: they read its TempDir.
	var stop sync.Once
	stopReaders := func() { stop.Do(func() { close(done); wg.Wait() }) }
	defer stopReaders()
	for n := 1; n <= writes; n++ {
		if _, _, _, err := w.WriteClaim(uid, envs(n), gpu0); err != nil {
			t.Fatal(err)
		}
	}
	stopReaders()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if spec := readSpec(t, path); spec.ContainerEdits.Env[0] != fmt.Sprintf("VERSION_0=%d", writes) {
		t.Errorf("last write lost: %s", spec.ContainerEdits.Env[0])
	}
	assertNoTempFiles(t, w.Dir())
}

func TestRemoveClaim(t *testing.T) {
	w := newWriter(t)
	other := types.UID("other")
	for _, u := range []types.UID{uid, other} {
		if _, _, _, err := w.WriteClaim(u, nil, gpu0); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.RemoveClaim(uid); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(w.Dir(), SpecName(uid)+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("spec still there: %v", err)
	}
	// Idempotent: a missing spec is not an error.
	if err := w.RemoveClaim(uid); err != nil {
		t.Errorf("second remove: %v", err)
	}
	if got, err := w.ClaimSpecs(); err != nil || !reflect.DeepEqual(got, []types.UID{other}) {
		t.Errorf("ClaimSpecs = %v, %v", got, err)
	}
}

func TestClaimSpecsIgnoresOtherFiles(t *testing.T) {
	w := newWriter(t)
	for _, u := range []types.UID{"b", "a"} {
		if _, _, _, err := w.WriteClaim(u, nil, gpu0); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{
		"nvidia.com-gpu.json",            // another vendor's spec
		"gpu.facet.dev-claim_c.yaml",     // not Facet's extension
		"spec.123.tmp",                   // a CDI writer's temp file
		"gpu.facet.dev-claim_d.json.tmp", // someone's temp file
	} {
		if err := os.WriteFile(filepath.Join(w.Dir(), f), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := w.ClaimSpecs()
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(got, func(i, j int) bool { return got[i] < got[j] })
	if !reflect.DeepEqual(got, []types.UID{"a", "b"}) {
		t.Errorf("ClaimSpecs = %v, want [a b]", got)
	}
}

// TestWriteClaimRefusesInvalidSpec: CDI refuses a device without edits;
// nothing is written, and an earlier spec of the claim stays.
func TestWriteClaimRefusesInvalidSpec(t *testing.T) {
	w := newWriter(t)
	if _, _, _, err := w.WriteClaim(uid, nil, gpu0); err != nil {
		t.Fatal(err)
	}
	_, _, _, err := w.WriteClaim(uid, nil, []Device{{Name: "gpu-1"}})
	if err == nil || !strings.Contains(err.Error(), "write CDI spec") || !strings.Contains(err.Error(), SpecName(uid)) {
		t.Fatalf("WriteClaim with an empty device: %v", err)
	}
	spec := readSpec(t, filepath.Join(w.Dir(), SpecName(uid)+".json"))
	if len(spec.Devices) != 1 || spec.Devices[0].Name != string(uid)+"-gpu-0" {
		t.Errorf("earlier spec changed: %+v", spec.Devices)
	}
	assertNoTempFiles(t, w.Dir())
}

func TestNewWriterErrors(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dir, want string
	}{
		{"directory is a file", file, "CDI spec directory"},
		{"parent is a file", filepath.Join(file, "cdi"), "CDI spec directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewWriter(tc.dir); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewWriter(%s) = %v, want an error about %q", tc.dir, err, tc.want)
			}
		})
	}
	// Listing a directory that disappeared names it.
	w := newWriter(t)
	if err := os.RemoveAll(w.Dir()); err != nil {
		t.Fatal(err)
	}
	if _, err := w.ClaimSpecs(); err == nil || !strings.Contains(err.Error(), w.Dir()) {
		t.Errorf("ClaimSpecs on a removed dir: %v", err)
	}
}

// TestTwoSharesOfOneDevice: two shares of gpu-5 in one claim get distinct
// CDI devices, and the spec is valid (M2: it used to have a duplicate name
// and could never be written).
func TestTwoSharesOfOneDevice(t *testing.T) {
	w, err := NewWriter(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	node := &cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/nvidia5"}}}
	name, ids, hash, err := w.WriteClaim("uid-1", nil, []Device{{Name: "gpu-5", Edits: node}, {Name: "gpu-5", Edits: node}, {Name: "gpu-6", Edits: node}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"gpu.facet.dev/claim=uid-1-gpu-5", "gpu.facet.dev/claim=uid-1-gpu-5_1", "gpu.facet.dev/claim=uid-1-gpu-6"}
	if strings.Join(ids, " ") != strings.Join(want, " ") {
		t.Fatalf("ids %v, want %v", ids, want)
	}
	spec, err := cdiapi.ReadSpec(filepath.Join(w.Dir(), name), 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		_, _, dev, _ := parser.ParseQualifiedName(id)
		if spec.GetDevice(dev) == nil {
			t.Errorf("spec lacks %s", dev)
		}
	}
	if err := w.Verify("uid-1", hash); err != nil {
		t.Fatal(err)
	}
}

// TestVerify: a missing, truncated or different spec fails verification.
func TestVerify(t *testing.T) {
	w, _ := NewWriter(t.TempDir())
	name, _, hash, err := w.WriteClaim("uid-1", nil, []Device{{Name: "gpu-0", Edits: nodeEdits}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(w.Dir(), name)
	data, _ := os.ReadFile(path)
	for _, tc := range []struct {
		name   string
		damage func()
	}{
		{"truncated", func() {
			if err := os.WriteFile(path, data[:len(data)/2], 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"edited", func() {
			if err := os.WriteFile(path, append(data, ' '), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"missing", func() { os.Remove(path) }},
	} {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := w.Verify("uid-1", hash); err != nil {
			t.Fatalf("%s: intact spec fails: %v", tc.name, err)
		}
		tc.damage()
		if err := w.Verify("uid-1", hash); err == nil {
			t.Errorf("%s: verified", tc.name)
		}
	}
}

// TestSweepTemp: temp files of a crashed write go; another writer's fresh
// temp file and other files stay (L3).
func TestSweepTemp(t *testing.T) {
	dir := t.TempDir()
	w, _ := NewWriter(dir)
	old := time.Now().Add(-time.Hour)
	files := map[string]bool{ // name: removed
		TempPrefix + "gpu.facet.dev-claim_uid-1.json.123.tmp": true,
		"spec.456.tmp":                   true,
		"spec.789.tmp":                   false, // fresh: maybe someone's write in progress
		"nvidia.yaml":                    false,
		"other.tmp":                      false,
		"gpu.facet.dev-claim_uid-2.json": false,
	}
	for name := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chtimes(filepath.Join(dir, "spec.456.tmp"), old, old); err != nil {
		t.Fatal(err)
	}
	removed, err := w.SweepTemp()
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 2 {
		t.Errorf("removed %v", removed)
	}
	for name, gone := range files {
		_, err := os.Stat(filepath.Join(dir, name))
		if gone != os.IsNotExist(err) {
			t.Errorf("%s: removed=%v, want %v", name, os.IsNotExist(err), gone)
		}
	}
}

// TestBadUIDRefused: a UID that is not one safe path element never reaches
// the file system (L1).
func TestBadUIDRefused(t *testing.T) {
	parent := t.TempDir()
	w, _ := NewWriter(filepath.Join(parent, "cdi"))
	victim := filepath.Join(parent, "victim.json")
	if err := os.WriteFile(victim, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, uid := range []types.UID{"../victim", "a/../../victim", "", ".."} {
		if _, _, _, err := w.WriteClaim(uid, nil, []Device{{Name: "gpu-0"}}); err == nil {
			t.Errorf("WriteClaim(%q) accepted", uid)
		}
		if err := w.RemoveClaim(uid); err == nil {
			t.Errorf("RemoveClaim(%q) accepted", uid)
		}
	}
	if _, err := os.Stat(victim); err != nil {
		t.Fatal("a file outside the CDI directory was touched")
	}
}

// FuzzDeviceNames: for any valid claim UID and DNS-label device names, the
// derived CDI device names are valid, qualify into parseable IDs, and are
// distinct within the claim.
func FuzzDeviceNames(f *testing.F) {
	f.Add("uid-1", "gpu-5", "gpu-5", "gpu-0-mig-1g.10gb-6")
	f.Add("4f6c8a0e-2b1d-4e0a-9c3f-0123456789ab", "gpu-0", "gpu-0-mig-1g.10gb-6", "gpu-0")
	f.Fuzz(func(t *testing.T, uid, a, b, c string) {
		if claimuid.Validate(types.UID(uid)) != nil {
			return
		}
		devices := []string{a, b, c}
		for _, d := range devices {
			if !dnsLabel(d) {
				return
			}
		}
		names := DeviceNames(types.UID(uid), devices)
		seen := map[string]bool{}
		for i, n := range names {
			if err := parser.ValidateDeviceName(n); err != nil {
				t.Fatalf("device %q of claim %q: name %q: %v", devices[i], uid, n, err)
			}
			vendor, class, dev, err := parser.ParseQualifiedName(parser.QualifiedName(Vendor, Class, n))
			if err != nil || vendor != Vendor || class != Class || dev != n {
				t.Fatalf("%q does not round-trip: %v", n, err)
			}
			if seen[n] {
				t.Fatalf("duplicate name %q in %v", n, names)
			}
			seen[n] = true
		}
		if names[0] != cdiDeviceName(types.UID(uid), a) {
			t.Fatalf("first occurrence renamed: %q", names[0])
		}
	})
}

var nodeEdits = &cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/nvidia0"}}}

// dnsLabel is what DRA device names are (RFC 1123 label); MIG device
// names add dots, which ResourceSlice validation allows in device names.
func dnsLabel(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		lower := c >= 'a' && c <= 'z'
		digit := c >= '0' && c <= '9'
		inner := (c == '-' || c == '.') && i > 0 && i < len(s)-1
		if !lower && !digit && !inner {
			return false
		}
	}
	return true
}

// TestValidateAgreesWithReadSpec: WriteClaim checks specs in memory
// (validate) instead of reading the file back through the CDI library. For
// each spec, valid or not, validate must agree with cdi.ReadSpec on the
// bytes WriteClaim would write, which is how the runtime reads them.
func TestValidateAgreesWithReadSpec(t *testing.T) {
	dev := func(name string, e cdispec.ContainerEdits) cdispec.Device {
		return cdispec.Device{Name: name, ContainerEdits: e}
	}
	nodes := cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/nvidia0"}}}
	for _, tc := range []struct {
		name string
		spec cdispec.Spec
		ok   bool
	}{
		{"one device", cdispec.Spec{Kind: Kind, Devices: []cdispec.Device{dev("a", nodes)}}, true},
		{"common edits", cdispec.Spec{Kind: Kind, ContainerEdits: cdispec.ContainerEdits{Env: []string{"A=1"}, Mounts: []*cdispec.Mount{{HostPath: "/h", ContainerPath: "/c"}},
			Hooks: []*cdispec.Hook{{HookName: "createContainer", Path: "/bin/hook"}}}, Devices: []cdispec.Device{dev("a", nodes)}}, true},
		{"env only device", cdispec.Spec{Kind: Kind, Devices: []cdispec.Device{dev("a", cdispec.ContainerEdits{Env: []string{"X=y"}})}}, true},
		{"no devices", cdispec.Spec{Kind: Kind}, false},
		{"empty device edits", cdispec.Spec{Kind: Kind, Devices: []cdispec.Device{dev("a", cdispec.ContainerEdits{})}}, false},
		{"bad device name", cdispec.Spec{Kind: Kind, Devices: []cdispec.Device{dev("a b", nodes)}}, false},
		{"duplicate device", cdispec.Spec{Kind: Kind, Devices: []cdispec.Device{dev("a", nodes), dev("a", nodes)}}, false},
		{"bad vendor", cdispec.Spec{Kind: "-bad/claim", Devices: []cdispec.Device{dev("a", nodes)}}, false},
		{"bad class", cdispec.Spec{Kind: Vendor + "/-x", Devices: []cdispec.Device{dev("a", nodes)}}, false},
		{"bad env", cdispec.Spec{Kind: Kind, ContainerEdits: cdispec.ContainerEdits{Env: []string{"=x"}}, Devices: []cdispec.Device{dev("a", nodes)}}, false},
		{"relative device node", cdispec.Spec{Kind: Kind, Devices: []cdispec.Device{dev("a", cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{{Path: ""}}})}}, false},
		{"bad hook", cdispec.Spec{Kind: Kind, ContainerEdits: cdispec.ContainerEdits{Hooks: []*cdispec.Hook{{HookName: "nope", Path: "/bin/hook"}}}, Devices: []cdispec.Device{dev("a", nodes)}}, false},
		{"bad mount", cdispec.Spec{Kind: Kind, Devices: []cdispec.Device{dev("a", cdispec.ContainerEdits{Mounts: []*cdispec.Mount{{HostPath: "/h"}}})}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec
			v, err := cdispec.MinimumRequiredVersion(&spec)
			if err != nil {
				t.Fatal(err)
			}
			spec.Version = v
			got := validate(&spec)
			data, err := json.Marshal(&spec)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "s.json")
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			_, lib := cdiapi.ReadSpec(path, 0)
			if (got == nil) != tc.ok || (lib == nil) != tc.ok {
				t.Fatalf("validate: %v; cdi.ReadSpec: %v; want ok=%v", got, lib, tc.ok)
			}
		})
	}
}
