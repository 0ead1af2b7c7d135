package hami

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// The layout of HAMi-core's accounting region, shared_region_t in
// src/multiprocess/multiprocess_memory_limit.h at the commit the chart's
// HAMi image builds (5091a2fb, format 1.x), as the x86-64 and arm64 C ABI
// lays it out: HAMi's own vGPU monitor reads the same struct
// (Project-HAMi/HAMi pkg/monitor/nvidia/v1/spec.go). Offsets in bytes.
const (
	regionMagic        = 19920718 // MULTIPROCESS_SHARED_REGION_MAGIC_FLAG
	regionMajor        = 1
	regionMaxDevices   = 16   // CUDA_DEVICE_MAX_COUNT
	regionMaxProcs     = 1024 // SHARED_REGION_MAX_PROCESS_NUM
	offInitialized     = 0    // int32 initialized_flag
	offMajor           = 4    // uint32 major_version
	offDeviceNum       = 56   // uint64 device_num, after owner_pid and a 32-byte sem_t
	offSMLimit         = 1728 // uint64 sm_limit[16], after uuids[16][96] and limit[16]
	offProcs           = 1856 // shrreg_proc_slot_t procs[1024], after uuids, limit, sm_limit
	procSlotSize       = 1960 // int32 pid, hostpid; used[16]; monitorused[16]; device_util[16]; status; seqlock; unused[2]
	slotOffHostPID     = 4    // int32 hostpid
	slotOffStatus      = 1928 // int32 status
	slotOffUsed        = 8    // device_memory_t used[16], 64 bytes each
	slotOffDeviceUtil  = 1160 // device_util_t device_util[16], 48 bytes each
	deviceMemorySize   = 64
	deviceMemOffTotal  = 32 // uint64 total, after context_size, module_size, data_size, offset
	deviceUtilSize     = 48
	deviceUtilOffSM    = 16 // uint64 sm_util, after dec_util and enc_util
	offProcNum         = offProcs + regionMaxProcs*procSlotSize
	regionHeaderLength = offProcs
	// regionSize is sizeof(shared_region_t): proc_num, utilization_switch,
	// recent_kernel, priority, last_kernel_time and sem_postinit after the
	// slots. HAMi-core sizes the file to it before it sets the flag.
	regionSize = offProcNum + 4*4 + 8 + 32
)

// ErrNoRegion is wrapped when a claim has no accounting region yet: no
// process of it has started under HAMi-core.
var ErrNoRegion = errors.New("no HAMi-core accounting region")

// RegionUsage is what one accounting region says its claim's processes
// use, as HAMi's vGPU monitor reads it (cmd/vGPUmonitor/metrics.go,
// pkg/monitor/nvidia/v1/spec.go: DeviceMemoryTotal, DeviceSmUtil).
type RegionUsage struct {
	// UsedBytes is the GPU memory, in bytes, the live processes hold on
	// all the region's devices together: each live slot's used[].total
	// (context, modules and allocations, as HAMi-core charges them
	// against CUDA_DEVICE_MEMORY_LIMIT).
	UsedBytes int64
	// SMUtilPercent is the live processes' SM utilization, summed over
	// them and the region's devices, in percent of one GPU: what NVML's
	// nvmlDeviceGetProcessUtilization sampled for each process over the
	// last second, which HAMi-core's utilization watcher writes into the
	// slot (device_util[].sm_util). -1 where nothing writes it: the
	// watcher runs only under an SM limit (CUDA_DEVICE_SM_LIMIT 1-100 on
	// some device; not for MPS shares, whose limit is MPS's) and writes
	// only slots whose host PID it has found.
	SMUtilPercent int64
}

// ReadRegionUsage reads the region at path: its header and the first
// proc_num slots, of which those whose status is set are live (a region is
// 2 MB; a claim's processes use a few slots). Errors name the file:
// ErrNoRegion where it does not exist yet, and a region that is not
// HAMi-core's format 1.x.
func ReadRegionUsage(path string) (RegionUsage, error) {
	none := RegionUsage{SMUtilPercent: -1}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return none, fmt.Errorf("%s: %w", path, ErrNoRegion)
	}
	if err != nil {
		return none, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil {
		return none, fmt.Errorf("%s: %w", path, err)
	} else if st.Size() < regionSize {
		return none, fmt.Errorf("%s: %w (%d bytes, shorter than HAMi-core's region of %d)", path, ErrNoRegion, st.Size(), regionSize)
	}
	le := binary.LittleEndian
	head := make([]byte, regionHeaderLength)
	if _, err := f.ReadAt(head, 0); err != nil {
		if errors.Is(err, io.EOF) {
			return none, fmt.Errorf("%s: %w (shorter than its header)", path, ErrNoRegion)
		}
		return none, fmt.Errorf("%s: %w", path, err)
	}
	if magic := int32(le.Uint32(head[offInitialized:])); magic != regionMagic {
		// HAMi-core writes the flag last when it sets the region up.
		return none, fmt.Errorf("%s: %w (not initialized)", path, ErrNoRegion)
	}
	if major := le.Uint32(head[offMajor:]); major != regionMajor {
		return none, fmt.Errorf("%s: HAMi-core region format %d.x, this build reads %d.x", path, major, regionMajor)
	}
	devices := int(min(le.Uint64(head[offDeviceNum:]), regionMaxDevices))
	// HAMi-core starts its utilization watcher only when some device has
	// an SM limit (multiprocess_utilization_watcher.c,
	// init_utilization_watcher).
	watched := false
	for d := 0; d < devices; d++ {
		if l := le.Uint64(head[offSMLimit+8*d:]); l > 0 && l <= 100 {
			watched = true
		}
	}
	var n [4]byte
	if _, err := f.ReadAt(n[:], offProcNum); err != nil {
		return none, fmt.Errorf("%s: proc_num: %w", path, err)
	}
	procs := int(min(max(int32(le.Uint32(n[:])), 0), regionMaxProcs))
	slots := make([]byte, procs*procSlotSize)
	if _, err := f.ReadAt(slots, offProcs); err != nil {
		return none, fmt.Errorf("%s: process slots: %w", path, err)
	}
	u := none
	var sm int64
	sampled := false
	for p := 0; p < procs; p++ {
		slot := slots[p*procSlotSize : (p+1)*procSlotSize]
		if le.Uint32(slot[slotOffStatus:]) == 0 {
			continue
		}
		hostPID := int32(le.Uint32(slot[slotOffHostPID:])) != 0
		for d := 0; d < devices; d++ {
			u.UsedBytes += int64(le.Uint64(slot[slotOffUsed+d*deviceMemorySize+deviceMemOffTotal:]))
			if watched && hostPID {
				sm += int64(le.Uint64(slot[slotOffDeviceUtil+d*deviceUtilSize+deviceUtilOffSM:]))
				sampled = true
			}
		}
	}
	if sampled {
		u.SMUtilPercent = sm
	}
	return u, nil
}
