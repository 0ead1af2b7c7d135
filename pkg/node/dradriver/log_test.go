package dradriver

import (
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
)

// logLine is what one log entry says: its type, message, and its key/value
// pairs printed with %v.
type logLine struct {
	typ ktesting.LogType
	msg string
	kv  map[string]string
}

// TestUnitOneLogLinePerClaim: every prepare and unprepare, successful or
// not, logs exactly one entry at verbosity 0 (the plugin's default), which
// names the claim and its UID, and describes its devices: a MIG device's
// profile, placement, GPU and compute instance and MIG UUID, a share's
// memory in bytes and SM percent.
func TestUnitOneLogLinePerClaim(t *testing.T) {
	t.Parallel()
	unprepare := func(u *unit, c *resourceapi.ResourceClaim) error {
		obj := kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, UID: c.UID}
		res, err := u.d.UnprepareResourceClaims(u.ctx, []kubeletplugin.NamespacedObject{obj})
		if err != nil {
			return err
		}
		return res[c.UID]
	}
	prepare := func(u *unit, c *resourceapi.ResourceClaim) error { return u.prepare(c)[c.UID].Err }
	mig := func(u *unit) *resourceapi.ResourceClaim { return claim("small", u.migDevice(0, "1g.10gb", 6)) }
	for _, tc := range []struct {
		name string
		cfg  inventory.Config
		// setup runs before logging is captured; op is the one call
		// whose log is checked.
		setup func(*unit)
		op    func(*unit) error
		// wantErr: the op fails. typ and msg: the entry's. want: its
		// key/value pairs contain these strings.
		wantErr bool
		typ     ktesting.LogType
		msg     string
		want    func(*unit) map[string][]string
	}{
		{
			name: "whole GPUs prepared",
			cfg:  inventory.Config{DefaultMode: inventory.ModeExclusive},
			op:   func(u *unit) error { return prepare(u, claim("pair", "gpu-2", "gpu-3")) },
			typ:  ktesting.LogInfo, msg: "Prepared claim",
			want: func(u *unit) map[string][]string {
				return map[string][]string{"claim": {"ns/pair"}, "uid": {"uid-pair"}, "outcome": {"prepared"},
					"devices": {"gpu-2 (gpu " + u.inv.GPUs[2].UUID + ")", "gpu-3 (gpu " + u.inv.GPUs[3].UUID + ")"}}
			},
		},
		{
			name: "MIG device prepared",
			cfg:  inventory.Config{DefaultMode: inventory.ModeMIG},
			op:   func(u *unit) error { return prepare(u, mig(u)) },
			typ:  ktesting.LogInfo, msg: "Prepared claim",
			want: func(u *unit) map[string][]string {
				g := u.inv.GPUs[0].UUID
				return map[string][]string{"claim": {"ns/small"}, "uid": {"uid-small"},
					"devices": {u.migDevice(0, "1g.10gb", 6) + " (mig 1g.10gb (GI profile ID 19, NVML index 0), memory slices 6-6, GI 1, CI 0, MIG-fake-" + g + "-1 on " + g + ")"}}
			},
		},
		{
			name: "MIG device prepared again",
			cfg:  inventory.Config{DefaultMode: inventory.ModeMIG},
			setup: func(u *unit) {
				if err := prepare(u, mig(u)); err != nil {
					u.t.Fatal(err)
				}
			},
			op:  func(u *unit) error { return prepare(u, mig(u)) },
			typ: ktesting.LogInfo, msg: "Prepared claim",
			want: func(u *unit) map[string][]string {
				return map[string][]string{"outcome": {"already prepared"}, "devices": {"GI 1, CI 0, MIG-fake-"}}
			},
		},
		{
			name: "vGPU share prepared",
			cfg:  inventory.Config{DefaultMode: inventory.ModeShared},
			op:   func(u *unit) error { return prepare(u, share("volcano", "gpu-3", "2000Mi", 20)) },
			typ:  ktesting.LogInfo, msg: "Prepared claim",
			want: func(u *unit) map[string][]string {
				return map[string][]string{"claim": {"ns/volcano"},
					"devices": {"gpu-3 (share of " + u.inv.GPUs[3].UUID + ", memory 2097152000 bytes, SM 20%, enforced by HAMi-core, share share-volcano)"}}
			},
		},
		{
			name: "best-effort share prepared",
			cfg:  inventory.Config{DefaultMode: inventory.ModeShared},
			op:   func(u *unit) error { return prepare(u, share("notebook", "gpu-4", "4Gi", 0)) },
			typ:  ktesting.LogInfo, msg: "Prepared claim",
			want: func(*unit) map[string][]string {
				return map[string][]string{"devices": {"memory 4294967296 bytes, SM best effort, enforced by HAMi-core"}}
			},
		},
		{
			name: "vGPU slot prepared",
			cfg:  slotCfg(t),
			op:   func(u *unit) error { return prepare(u, claim("small", "gpu-3-slot-0")) },
			typ:  ktesting.LogInfo, msg: "Prepared claim",
			want: func(*unit) map[string][]string {
				return map[string][]string{"devices": {"gpu-3-slot-0 (slot of GPU-", "memory 21033385984 bytes, SM 25%, enforced by HAMi-core)"}}
			},
		},
		{
			name: "prepare refused",
			cfg:  inventory.Config{DefaultMode: inventory.ModeExclusive},
			setup: func(u *unit) {
				if err := prepare(u, claim("first", "gpu-1")); err != nil {
					u.t.Fatal(err)
				}
			},
			op:      func(u *unit) error { return prepare(u, claim("second", "gpu-1", "gpu-2")) },
			wantErr: true, typ: ktesting.LogError, msg: "Prepare failed",
			want: func(*unit) map[string][]string {
				return map[string][]string{"claim": {"ns/second"}, "uid": {"uid-second"}, "devices": {node + "/gpu-1 " + node + "/gpu-2"}}
			},
		},
		{
			name: "MIG device unprepared",
			cfg:  inventory.Config{DefaultMode: inventory.ModeMIG},
			setup: func(u *unit) {
				if err := prepare(u, mig(u)); err != nil {
					u.t.Fatal(err)
				}
			},
			op:  func(u *unit) error { return unprepare(u, mig(u)) },
			typ: ktesting.LogInfo, msg: "Unprepared claim",
			want: func(u *unit) map[string][]string {
				// The instance as it was, though the unprepare destroyed it.
				return map[string][]string{"claim": {"ns/small"}, "uid": {"uid-small"}, "outcome": {"unprepared"},
					"devices": {"(mig 1g.10gb (GI profile ID 19, NVML index 0), memory slices 6-6, GI 1, CI 0, MIG-fake-"}}
			},
		},
		{
			name: "share unprepared",
			cfg:  inventory.Config{DefaultMode: inventory.ModeShared},
			setup: func(u *unit) {
				if err := prepare(u, share("volcano", "gpu-3", "2000Mi", 20)); err != nil {
					u.t.Fatal(err)
				}
			},
			op:  func(u *unit) error { return unprepare(u, share("volcano", "gpu-3", "2000Mi", 20)) },
			typ: ktesting.LogInfo, msg: "Unprepared claim",
			want: func(*unit) map[string][]string {
				return map[string][]string{"devices": {"memory 2097152000 bytes, SM 20%"}}
			},
		},
		{
			name: "unknown claim unprepared",
			cfg:  inventory.Config{DefaultMode: inventory.ModeExclusive},
			op:   func(u *unit) error { return unprepare(u, claim("never-seen")) },
			typ:  ktesting.LogInfo, msg: "Nothing to unprepare: no record of the claim",
			want: func(*unit) map[string][]string {
				return map[string][]string{"claim": {"ns/never-seen"}, "uid": {"uid-never-seen"}}
			},
		},
		{
			name: "corrupt record unprepared",
			cfg:  inventory.Config{DefaultMode: inventory.ModeExclusive},
			setup: func(u *unit) {
				c := claim("broken", "gpu-5")
				if err := prepare(u, c); err != nil {
					u.t.Fatal(err)
				}
				rec, err := u.store.Get(c.UID)
				if err != nil {
					u.t.Fatal(err)
				}
				u.store.Corrupt(c.UID, rec)
			},
			op:  func(u *unit) error { return unprepare(u, claim("broken", "gpu-5")) },
			typ: ktesting.LogInfo, msg: "Unprepared claim",
			want: func(*unit) map[string][]string {
				return map[string][]string{"outcome": {"record corrupt", "salvaged"}, "devices": {"gpu-5 (gpu GPU-"}}
			},
		},
		{
			name: "corrupt record, nothing salvaged, unprepared",
			cfg:  inventory.Config{DefaultMode: inventory.ModeExclusive},
			setup: func(u *unit) {
				c := claim("lost", "gpu-6")
				if err := prepare(u, c); err != nil {
					u.t.Fatal(err)
				}
				u.store.Corrupt(c.UID, nil)
			},
			op:  func(u *unit) error { return unprepare(u, claim("lost", "gpu-6")) },
			typ: ktesting.LogInfo, msg: "Unprepared claim",
			want: func(*unit) map[string][]string {
				return map[string][]string{"claim": {"ns/lost"}, "outcome": {"record corrupt", "nothing salvaged"}}
			},
		},
		{
			name:    "unprepare of a malformed UID refused",
			cfg:     inventory.Config{DefaultMode: inventory.ModeExclusive},
			op:      func(u *unit) error { c := claim("bad"); c.UID = "../x"; return unprepare(u, c) },
			wantErr: true, typ: ktesting.LogError, msg: "Unprepare failed",
			want: func(*unit) map[string][]string {
				return map[string][]string{"claim": {"ns/bad"}, "uid": {"../x"}}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := newUnit(t, tc.cfg)
			if tc.setup != nil {
				tc.setup(u)
			}
			// Verbosity 0: only what the plugin logs by default reaches
			// the buffer.
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true), ktesting.Verbosity(0)))
			u.ctx = klog.NewContext(u.ctx, logger)
			err := tc.op(u)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want an error: %t", err, tc.wantErr)
			}
			entries := logger.GetSink().(ktesting.Underlier).GetBuffer().Data()
			if len(entries) != 1 {
				t.Fatalf("%d log entries, want 1:\n%s", len(entries), logger.GetSink().(ktesting.Underlier).GetBuffer().String())
			}
			e := entries[0]
			got := logLine{typ: e.Type, msg: e.Message, kv: map[string]string{}}
			for i := 0; i+1 < len(e.ParameterKVList); i += 2 {
				got.kv[fmt.Sprint(e.ParameterKVList[i])] = fmt.Sprint(e.ParameterKVList[i+1])
			}
			if got.typ != tc.typ || got.msg != tc.msg || e.Verbosity != 0 {
				t.Errorf("entry %s %q at V(%d), want %s %q at V(0)", got.typ, got.msg, e.Verbosity, tc.typ, tc.msg)
			}
			for key, wants := range tc.want(u) {
				for _, w := range wants {
					if !strings.Contains(got.kv[key], w) {
						t.Errorf("%s = %q, want it to contain %q", key, got.kv[key], w)
					}
				}
			}
		})
	}
}

// TestDescribeDevices: the log's description of each kind of device,
// including a MIG device whose instance does not exist (a prepare that
// failed and was rolled back) and a static MIG instance whose record
// predates the nvidia-smi profile ID.
func TestDescribeDevices(t *testing.T) {
	t.Parallel()
	shareID := types.UID("s-1")
	nine := 9
	got := describeDevices([]checkpoint.Device{
		{Device: "gpu-0", Kind: kindWhole, GPUUUID: "GPU-a"},
		{Device: "gpu-1-mig-3g40gb-4", Kind: kindMIG, GPUUUID: "GPU-b", MIG: &checkpoint.MIG{Profile: "3g.40gb", GIProfileID: 2, GIProfileInfoID: &nine, Start: 4, Size: 4}},
		{Device: "gpu-2-mig-1g10gb-0", Kind: kindStaticMIG, GPUUUID: "GPU-c", MIG: &checkpoint.MIG{Profile: "1g.10gb", Start: 0, Size: 1, GIID: 9, CIID: 0, UUID: "MIG-c9"}},
		{Device: "gpu-4", Kind: kindShare, GPUUUID: "GPU-d", ShareID: &shareID, Share: &checkpoint.Share{MemoryBytes: 85899345920, Cores: 100}},
	})
	want := []string{
		"gpu-0 (gpu GPU-a)",
		"gpu-1-mig-3g40gb-4 (mig 3g.40gb (GI profile ID 9, NVML index 2), memory slices 4-7, no instance on GPU-b)",
		"gpu-2-mig-1g10gb-0 (mig-static 1g.10gb, memory slices 0-0, GI 9, CI 0, MIG-c9 on GPU-c)",
		"gpu-4 (share of GPU-d, memory 85899345920 bytes, SM 100%, not enforced, share s-1)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
