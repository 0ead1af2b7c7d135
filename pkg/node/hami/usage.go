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
	offProcs           = 1856 // shrreg_proc_slot_t procs[1024], after uuids, limit, sm_limit
	procSlotSize       = 1960 // int32 pid, hostpid; used[16]; monitorused[16]; device_util[16]; status; seqlock; unused[2]
	slotOffStatus      = 1928 // int32 status
	slotOffUsed        = 8    // device_memory_t used[16], 64 bytes each
	deviceMemorySize   = 64
	deviceMemOffTotal  = 32 // uint64 total, after context_size, module_size, data_size, offset
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

// RegionUsedBytes is the GPU memory, in bytes, that the live processes of
// one accounting region hold on all its devices together: the sum of each
// active process slot's used[].total (context, modules and allocations, as
// HAMi-core charges them against CUDA_DEVICE_MEMORY_LIMIT), over the first
// proc_num slots whose status is set, as HAMi's vGPU monitor sums them. It
// reads the header and those slots only (a region is 2 MB; a claim's
// processes use a few slots). Errors name the file: ErrNoRegion where it
// does not exist yet, and a region that is not HAMi-core's format 1.x.
func RegionUsedBytes(path string) (int64, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("%s: %w", path, ErrNoRegion)
	}
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	} else if st.Size() < regionSize {
		return 0, fmt.Errorf("%s: %w (%d bytes, shorter than HAMi-core's region of %d)", path, ErrNoRegion, st.Size(), regionSize)
	}
	le := binary.LittleEndian
	head := make([]byte, regionHeaderLength)
	if _, err := f.ReadAt(head, 0); err != nil {
		if errors.Is(err, io.EOF) {
			return 0, fmt.Errorf("%s: %w (shorter than its header)", path, ErrNoRegion)
		}
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	if magic := int32(le.Uint32(head[offInitialized:])); magic != regionMagic {
		// HAMi-core writes the flag last when it sets the region up.
		return 0, fmt.Errorf("%s: %w (not initialized)", path, ErrNoRegion)
	}
	if major := le.Uint32(head[offMajor:]); major != regionMajor {
		return 0, fmt.Errorf("%s: HAMi-core region format %d.x, this build reads %d.x", path, major, regionMajor)
	}
	devices := int(min(le.Uint64(head[offDeviceNum:]), regionMaxDevices))
	var n [4]byte
	if _, err := f.ReadAt(n[:], offProcNum); err != nil {
		return 0, fmt.Errorf("%s: proc_num: %w", path, err)
	}
	procs := int(min(max(int32(le.Uint32(n[:])), 0), regionMaxProcs))
	slots := make([]byte, procs*procSlotSize)
	if _, err := f.ReadAt(slots, offProcs); err != nil {
		return 0, fmt.Errorf("%s: process slots: %w", path, err)
	}
	var used int64
	for p := 0; p < procs; p++ {
		slot := slots[p*procSlotSize : (p+1)*procSlotSize]
		if le.Uint32(slot[slotOffStatus:]) == 0 {
			continue
		}
		for d := 0; d < devices; d++ {
			used += int64(le.Uint64(slot[slotOffUsed+d*deviceMemorySize+deviceMemOffTotal:]))
		}
	}
	return used, nil
}
