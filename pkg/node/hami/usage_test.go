package hami

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"
)

// The C structs of HAMi-core's multiprocess_memory_limit.h (commit
// 5091a2fb), field for field, in Go's layout, which on 64-bit Linux is the
// C ABI's (int32 and uint64 aligned to their size, sem_t 32 bytes). A
// region written from them is one HAMi-core would write.
type cDeviceMemory struct {
	contextSize, moduleSize, dataSize, offset, total uint64
	unused                                           [3]uint64
}

type cDeviceUtil struct {
	dec, enc, sm uint64
	unused       [3]uint64
}

type cProcSlot struct {
	pid, hostpid int32
	used         [16]cDeviceMemory
	monitorused  [16]uint64
	deviceUtil   [16]cDeviceUtil
	status       int32
	seqlock      uint64
	unused       [2]uint64
}

type cSharedRegion struct {
	initializedFlag            int32
	majorVersion, minorVersion uint32
	smInitFlag                 int32
	ownerPid                   uint64
	sem                        [32]byte
	deviceNum                  uint64
	uuids                      [16][96]byte
	limit, smLimit             [16]uint64
	procs                      [1024]cProcSlot
	procNum                    int32
	utilizationSwitch          int32
	recentKernel               int32
	priority                   int32
	lastKernelTime             uint64
	semPostinit                [32]byte
}

// TestRegionLayout: the reader's offsets are the C structs'.
func TestRegionLayout(t *testing.T) {
	var r cSharedRegion
	var s cProcSlot
	var m cDeviceMemory
	var du cDeviceUtil
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"major_version", unsafe.Offsetof(r.majorVersion), offMajor},
		{"device_num", unsafe.Offsetof(r.deviceNum), offDeviceNum},
		{"procs", unsafe.Offsetof(r.procs), offProcs},
		{"proc_num", unsafe.Offsetof(r.procNum), offProcNum},
		{"sizeof(shrreg_proc_slot_t)", unsafe.Sizeof(s), procSlotSize},
		{"slot status", unsafe.Offsetof(s.status), slotOffStatus},
		{"sizeof(shared_region_t)", unsafe.Sizeof(r), regionSize},
		{"slot used", unsafe.Offsetof(s.used), slotOffUsed},
		{"sizeof(device_memory_t)", unsafe.Sizeof(m), deviceMemorySize},
		{"device_memory_t total", unsafe.Offsetof(m.total), deviceMemOffTotal},
		{"sm_limit", unsafe.Offsetof(r.smLimit), offSMLimit},
		{"slot hostpid", unsafe.Offsetof(s.hostpid), slotOffHostPID},
		{"slot device_util", unsafe.Offsetof(s.deviceUtil), slotOffDeviceUtil},
		{"sizeof(device_util_t)", unsafe.Sizeof(du), deviceUtilSize},
		{"device_util_t sm_util", unsafe.Offsetof(du.sm), deviceUtilOffSM},
	} {
		if c.got != c.want {
			t.Errorf("%s at %d, the reader uses %d", c.name, c.got, c.want)
		}
	}
}

// writeRegion writes r as HAMi-core maps it: the struct's bytes.
func writeRegion(t *testing.T, r *cSharedRegion) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), CacheFileName)
	b := unsafe.Slice((*byte)(unsafe.Pointer(r)), unsafe.Sizeof(*r))
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestReadRegionUsage: live slots' totals on every device of the region
// are summed; a slot whose status is clear, slots past proc_num and
// devices past device_num are not; SM utilization is summed likewise,
// and only where HAMi-core's utilization watcher writes it (an SM limit
// on some device, a slot whose host PID it found); a region not yet
// initialized, absent, or of another format is an error that says so.
func TestReadRegionUsage(t *testing.T) {
	const mib = 1 << 20
	region := func() *cSharedRegion {
		r := &cSharedRegion{initializedFlag: regionMagic, majorVersion: 1, minorVersion: 2, deviceNum: 2, procNum: 3}
		r.smLimit[1] = 30
		r.procs[0] = cProcSlot{pid: 10, hostpid: 4010, status: 1}
		r.procs[0].used[0].total = 1500 * mib
		r.procs[0].used[1].total = 100 * mib
		r.procs[0].deviceUtil[0].sm = 12
		r.procs[0].deviceUtil[1].sm = 7
		r.procs[1] = cProcSlot{pid: 11, status: 1} // host PID not found
		r.procs[1].used[0].total = 518 * mib
		r.procs[1].deviceUtil[0].sm = 50
		r.procs[2] = cProcSlot{pid: 12, hostpid: 4012, status: 0} // exited
		r.procs[2].used[0].total = 4000 * mib
		r.procs[2].deviceUtil[0].sm = 60
		r.procs[3] = cProcSlot{pid: 13, hostpid: 4013, status: 1} // past proc_num
		r.procs[3].used[0].total = 8000 * mib
		r.procs[3].deviceUtil[0].sm = 70
		r.procs[0].used[2].total = 9000 * mib // past device_num
		r.procs[0].deviceUtil[2].sm = 80
		return r
	}
	got, err := ReadRegionUsage(writeRegion(t, region()))
	if err != nil || got != (RegionUsage{UsedBytes: 2118 * mib, SMUtilPercent: 19}) {
		t.Fatalf("ReadRegionUsage = %d MiB, %d %% SM, %v; want 2118 MiB, 19 %%", got.UsedBytes/mib, got.SMUtilPercent, err)
	}
	for _, tc := range []struct {
		name string
		edit func(*cSharedRegion)
		want string
		none bool
		// usage is what is read where want is "".
		usage RegionUsage
	}{
		{"not initialized", func(r *cSharedRegion) { r.initializedFlag = 0 }, "not initialized", true, RegionUsage{}},
		{"another format", func(r *cSharedRegion) { r.majorVersion = 2 }, "format 2.x, this build reads 1.x", false, RegionUsage{}},
		{"a corrupt proc_num is clamped", func(r *cSharedRegion) { r.procNum = -5 }, "", false, RegionUsage{SMUtilPercent: -1}},
		{"no SM limit: no watcher", func(r *cSharedRegion) { r.smLimit[1] = 0 }, "", false, RegionUsage{UsedBytes: 2118 * mib, SMUtilPercent: -1}},
		{"an SM limit past device_num", func(r *cSharedRegion) { r.smLimit[1], r.smLimit[2] = 0, 30 }, "", false, RegionUsage{UsedBytes: 2118 * mib, SMUtilPercent: -1}},
		{"no host PID found", func(r *cSharedRegion) { r.procs[0].hostpid = 0 }, "", false, RegionUsage{UsedBytes: 2118 * mib, SMUtilPercent: -1}},
		{"idle under a limit", func(r *cSharedRegion) { r.procs[0].deviceUtil[0].sm, r.procs[0].deviceUtil[1].sm = 0, 0 }, "", false, RegionUsage{UsedBytes: 2118 * mib}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := region()
			tc.edit(r)
			got, err := ReadRegionUsage(writeRegion(t, r))
			if tc.want == "" {
				if err != nil || got != tc.usage {
					t.Fatalf("got %+v, %v; want %+v", got, err, tc.usage)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, ErrNoRegion) != tc.none {
				t.Fatalf("got %v, want an error with %q (no region: %v)", err, tc.want, tc.none)
			}
		})
	}
	short := filepath.Join(t.TempDir(), "short")
	if err := os.WriteFile(short, make([]byte, regionSize-1), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadRegionUsage(short); !errors.Is(err, ErrNoRegion) || !strings.Contains(err.Error(), "shorter than HAMi-core's region") {
		t.Fatalf("a region not yet sized: %v, want ErrNoRegion saying so", err)
	}
	if _, err := ReadRegionUsage(filepath.Join(t.TempDir(), "absent")); !errors.Is(err, ErrNoRegion) {
		t.Fatalf("absent region: %v, want ErrNoRegion", err)
	}
}
