package cdi

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/facet-gpu/facet/pkg/claimuid"
)

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
		{"truncated", func() { os.WriteFile(path, data[:len(data)/2], 0o644) }},
		{"edited", func() { os.WriteFile(path, append(data, ' '), 0o644) }},
		{"missing", func() { os.Remove(path) }},
	} {
		os.WriteFile(path, data, 0o644)
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
		tmpPrefix + "gpu.facet.dev-claim_uid-1.json.123.tmp": true,
		"spec.456.tmp":                   true,
		"spec.789.tmp":                   false, // fresh: maybe someone's write in progress
		"nvidia.yaml":                    false,
		"other.tmp":                      false,
		"gpu.facet.dev-claim_uid-2.json": false,
	}
	for name := range files {
		os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o644)
	}
	os.Chtimes(filepath.Join(dir, "spec.456.tmp"), old, old)
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
	os.WriteFile(victim, []byte("keep"), 0o644)
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
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || (c == '-' || c == '.') && i > 0 && i < len(s)-1) {
			return false
		}
	}
	return true
}
