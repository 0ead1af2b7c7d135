package dradriver

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
)

// TestUnreadableRecordKeepsDevicesReserved (M1): a record this build
// cannot trust (bad checksum, newer version) fails its claim, keeps its
// devices reserved, keeps --destroy-unowned-mig off its MIG instance, and
// its unprepare destroys that instance when it matches the record in
// every detail.
func TestUnreadableRecordKeepsDevicesReserved(t *testing.T) {
	needMIGEdits(t)
	for _, damage := range []struct {
		name string
		edit func(env map[string]any)
	}{
		{"bad checksum", func(env map[string]any) { env["checksum"] = "0000" }},
		{"future version", func(env map[string]any) { env["version"] = checkpoint.Version + 1 }},
	} {
		t.Run(damage.name, func(t *testing.T) {
			r := newRigMode(t, splitModes)
			whole, mig := claim("whole", "gpu-1"), claim("mig", r.migDevice(0, "1g.10gb", 6))
			for _, c := range []*resourceapi.ResourceClaim{whole, mig} {
				if _, err := r.prepareOne(c); err != nil {
					t.Fatal(err)
				}
			}
			r.compactCheckpoint()
			for _, c := range []*resourceapi.ResourceClaim{whole, mig} {
				path := filepath.Join(r.checkpoints, string(c.UID)+".json")
				data, _ := os.ReadFile(path)
				var env map[string]any
				if err := json.Unmarshal(data, &env); err != nil {
					t.Fatal(err)
				}
				damage.edit(env)
				data, _ = json.Marshal(env)
				if err := os.WriteFile(path, data, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			r.destroyUnowned = true
			r.restart()
			if n := r.migCount(); n != 1 {
				t.Fatalf("--destroy-unowned-mig destroyed the MIG instance of an unreadable record (%d left)", n)
			}
			for _, c := range []*resourceapi.ResourceClaim{claim("intruder", "gpu-1"), claim("intruder-mig", r.migDevice(0, "1g.10gb", 6))} {
				_, err := r.prepareOne(c)
				if err == nil || !strings.Contains(err.Error(), "conflicts with") {
					t.Errorf("%s: a device of an unreadable record was given away: %v", c.Name, err)
				}
			}
			if _, err := r.prepareOne(whole); err == nil || !strings.Contains(err.Error(), "corrupt checkpoint") {
				t.Errorf("claim with an unreadable record prepared: %v", err)
			}
			for _, c := range []*resourceapi.ResourceClaim{whole, mig} {
				if err := r.unprepareOne(c); err != nil {
					t.Fatal(err)
				}
			}
			r.audit()
			again := claim("after", "gpu-1")
			if _, err := r.prepareOne(again); err != nil {
				t.Fatalf("devices not free after unprepare: %v", err)
			}
		})
	}
}

// TestTwoSharesOfOneDeviceInOneClaim (M2, M2b): a claim with two shares of
// gpu-5 prepares, with two CDI devices and one HAMi-core index holding
// their sum.
func TestTwoSharesOfOneDeviceInOneClaim(t *testing.T) {
	r := newRigMode(t, inventory.Config{DefaultMode: inventory.ModeShared})
	c := share("double", "gpu-5", "4Gi", 20)
	second := c.Status.Allocation.Devices.Results[0]
	id := types.UID("share-double-2")
	second.ShareID = &id
	c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, second)
	devs, err := r.prepareOne(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 2 || devs[0].CDIDeviceIDs[0] == devs[1].CDIDeviceIDs[0] {
		t.Fatalf("devices %s", brief(devs))
	}
	spec := r.spec(c.UID)
	for _, want := range []string{"CUDA_DEVICE_MEMORY_LIMIT_0=8192m", "CUDA_DEVICE_SM_LIMIT_0=40"} {
		if !strings.Contains(spec, want) {
			t.Errorf("spec lacks %s", want)
		}
	}
	if strings.Contains(spec, "LIMIT_1") || strings.Count(spec, `"path":"/dev/nvidia5"`) != 1 {
		t.Errorf("the GPU is given twice:\n%s", spec)
	}
	r.audit(c)
}

// TestReservationHeldUntilRecordDeleted (M3): when unprepare cannot delete
// the record, the devices stay reserved; the retry finishes the job.
func TestReservationHeldUntilRecordDeleted(t *testing.T) {
	r := newRig(t)
	needPrivateMounts(t)
	mountTmpfs(t, r.checkpoints, "1m")
	r.restart()
	first := claim("first", "gpu-1")
	if _, err := r.prepareOne(first); err != nil {
		t.Fatal(err)
	}
	remount(t, r.checkpoints, true)
	if err := r.unprepareOne(first); err == nil || !strings.Contains(err.Error(), "read-only file system") {
		t.Fatalf("unprepare with a read-only state directory: %v", err)
	}
	second := claim("second", "gpu-1")
	if _, err := r.prepareOne(second); err == nil || !strings.Contains(err.Error(), "conflicts with whole GPU gpu-1 of claim ns/first") {
		t.Fatalf("gpu-1 given away before its record was deleted: %v", err)
	}
	remount(t, r.checkpoints, false)
	if err := r.unprepareOne(first); err != nil {
		t.Fatal(err)
	}
	if _, err := r.prepareOne(second); err != nil {
		t.Fatal(err)
	}
	r.audit(second)
}

// TestDiskFullAndReadOnly: with the state or CDI directory full or read-only,
// a claim of each kind fails naming itself and the cause, and nothing is
// half-written: no spec, record, region, MIG instance or temp file. Once
// the directory is writable again, the kubelet's retry succeeds.
func TestDiskFullAndReadOnly(t *testing.T) {
	needMIGEdits(t)
	needPrivateMounts(t)
	for _, s := range subjects {
		for _, dir := range []string{"state", "cdi"} {
			for _, fault := range []string{"full", "read-only"} {
				t.Run(fmt.Sprintf("%s/%s %s", s.kind, dir, fault), func(t *testing.T) {
					r := newRigMode(t, splitModes)
					path := map[string]string{"state": r.checkpoints, "cdi": r.cdiDir}[dir]
					mountTmpfs(t, path, "256k")
					r.restart()
					undo := func() {}
					var want string
					switch fault {
					case "full":
						filler := filepath.Join(path, "filler")
						fill(t, filler)
						undo = func() { os.Remove(filler) }
						want = "no space left on device"
					case "read-only":
						remount(t, path, true)
						undo = func() { remount(t, path, false) }
						want = "read-only file system"
					}
					c := s.claim(r)
					err := r.prepare(c)[c.UID].Err
					if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "claim ns/subject") {
						t.Fatalf("error %v, want the claim and %q named", err, want)
					}
					undo()
					r.audit()
					if err := r.prepare(c)[c.UID].Err; err != nil {
						t.Fatalf("retry: %v", err)
					}
					r.audit(c)
				})
			}
		}
	}
}

// TestSlowGPUEditsDoNotBlockOtherGPUs (M4): while nvcdi hangs on one GPU's
// edits, the first prepare on another GPU completes.
func TestSlowGPUEditsDoNotBlockOtherGPUs(t *testing.T) {
	r := newRig(t)
	hung, release := make(chan struct{}), make(chan struct{})
	slowGPU := r.inv.GPUs[0].UUID
	r.wrapEdits = func(e EditSource) EditSource {
		return slowEdits{EditSource: e, gpu: slowGPU, hung: hung, release: release}
	}
	r.restart()
	// The slow prepare hangs in nvcdi until release. The test waits for it
	// before it returns: a prepare still writing its CDI spec while the
	// test's TempDir is removed fails the cleanup ("directory not empty").
	slow := make(chan error, 1)
	go func() { _, err := r.prepareOne(claim("slow", "gpu-0")); slow <- err }()
	defer func() {
		close(release)
		if err := <-slow; err != nil {
			t.Errorf("the slow prepare, once released: %v", err)
		}
	}()
	<-hung
	done := make(chan error, 1)
	go func() { _, err := r.prepareOne(claim("fast", "gpu-1")); done <- err }()
	// A prepare that waited for gpu-0 would wait forever (release comes
	// only at the end), so the bound only turns a deadlock into a failure;
	// it is generous so that load cannot trip it.
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("a prepare on gpu-1 waited for nvcdi on gpu-0")
	}
}

type slowEdits struct {
	EditSource
	gpu           string
	hung, release chan struct{}
}

func (s slowEdits) GPUEdits(uuid string) (*cdispec.ContainerEdits, error) {
	if uuid == s.gpu {
		close(s.hung)
		<-s.release
	}
	return s.EditSource.GPUEdits(uuid)
}

// TestBadClaimUID (L1): a UID that is not one safe path element fails its
// claim before any file is touched.
func TestBadClaimUID(t *testing.T) {
	r := newRig(t)
	victim := filepath.Join(filepath.Dir(r.checkpoints), "victim.json")
	if err := os.WriteFile(victim, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, uid := range []types.UID{"../victim", "..", "a/b"} {
		c := claim("bad", "gpu-0")
		c.UID = uid
		if _, err := r.prepareOne(c); err == nil || !strings.Contains(err.Error(), "claim UID") {
			t.Errorf("prepare %q: %v", uid, err)
		}
		if err := r.unprepareOne(c); err == nil {
			t.Errorf("unprepare %q accepted", uid)
		}
	}
	if _, err := os.Stat(victim); err != nil {
		t.Fatal("a file outside the state directory was touched")
	}
	r.audit()
}

// TestStartSweepsTempFiles (L3): temp files a crash left in the CDI
// directory are removed at start.
func TestStartSweepsTempFiles(t *testing.T) {
	r := newRig(t)
	stale := filepath.Join(r.cdiDir, "spec.12345.tmp")
	if err := os.WriteFile(stale, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	r.restart()
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatal("temp file left in the CDI directory")
	}
	r.audit()
}

// TestNoHAMiFailsSharesOnly (L4): without a working HAMi-core the plugin
// starts, whole GPUs prepare, and share claims fail saying why.
func TestNoHAMiFailsSharesOnly(t *testing.T) {
	r := newRigMode(t, splitModes)
	r.noHAMi = true
	r.restart()
	if _, err := r.prepareOne(claim("whole", "gpu-1")); err != nil {
		t.Fatal(err)
	}
	_, err := r.prepareOne(share("vgpu", "gpu-5", "1Gi", 10))
	if err == nil || !strings.Contains(err.Error(), "HAMi-core, which is unavailable") || !strings.Contains(err.Error(), "no-such-libvgpu.so") {
		t.Fatalf("share without HAMi-core: %v", err)
	}
}

func needPrivateMounts(t *testing.T) {
	t.Helper()
	if os.Getenv(privateNamespaceEnv) != "1" {
		t.Skip("needs a private mount namespace (root)")
	}
}

func mountTmpfs(t *testing.T, dir, size string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) }) // best effort
}

func remount(t *testing.T, dir string, readOnly bool) {
	t.Helper()
	flags := uintptr(syscall.MS_REMOUNT)
	if readOnly {
		flags |= syscall.MS_RDONLY
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", flags, ""); err != nil {
		t.Fatal(err)
	}
}

// fill writes to path until the file system is full.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return
		}
	}
}

// TestOldBootIDsNeverDestroy: a record from the last boot whose voided
// IDs could not be written back at start (read-only state directory) still
// destroys nothing at unprepare, even where an instance of this boot has
// its IDs.
func TestOldBootIDsNeverDestroy(t *testing.T) {
	needMIGEdits(t)
	needPrivateMounts(t)
	r := newRigMode(t, splitModes)
	mountTmpfs(t, r.checkpoints, "1m")
	r.restart()
	c := claim("mig", r.migDevice(0, "1g.10gb", 6))
	if _, err := r.prepareOne(c); err != nil {
		t.Fatal(err)
	}
	// The MIG state stays: it stands for an instance made after the
	// reboot that got the same IDs.
	if err := os.WriteFile(r.bootIDFile, []byte("boot-2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	remount(t, r.checkpoints, true)
	r.restart()
	// Ignored: with the state directory read-only the unprepare may fail;
	// what matters is that it destroys nothing.
	_ = r.unprepareOne(c)
	if n := r.migCount(); n != 1 {
		t.Fatalf("unprepare of a record from the last boot destroyed an instance of this boot (%d left)", n)
	}
}
