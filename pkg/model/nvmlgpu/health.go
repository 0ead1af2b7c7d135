package nvmlgpu

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// HealthEvent is one observation of a GPU's health: a fault NVML reported
// (an XID, a double-bit ECC error, a GPU fallen off the bus, a failing
// query) or, with Healthy, a periodic probe that succeeded.
type HealthEvent struct {
	// GPU is the physical GPU's UUID ("GPU-...").
	GPU string
	// Healthy marks a successful probe; the other fields are then empty.
	Healthy bool
	// Reason is short and stable, usable as a taint value: "xid-79",
	// "ecc-dbe", "gpu-lost", "nvml-query-failed".
	Reason string
	// XID is the XID number for Reason "xid-<n>", else 0.
	XID uint64
	// Fatal faults need a GPU reset or a reboot (NVIDIA's documented
	// resolution); the others may pass.
	Fatal bool
	// Detail is a sentence for Events and logs.
	Detail string
	// Time is when the plugin observed it.
	Time time.Time
}

// XID classes. Source: NVIDIA's "Xid Errors" catalogue
// (https://docs.nvidia.com/deploy/xid-errors/), resolution column, and the
// application-error list NVIDIA's k8s-device-plugin skips
// (internal/rm/health.go: 13, 31, 43, 45, 68, 109).
var (
	// applicationXIDs are caused by a program, not the GPU: a bad kernel,
	// a page fault, a program stopped. They never make a GPU unhealthy.
	applicationXIDs = map[uint64]bool{13: true, 31: true, 43: true, 45: true, 68: true, 109: true}
	// fatalXIDs' documented resolution is a GPU reset or a node reboot:
	// 48 double-bit ECC, 62 internal micro-controller halt, 64 ECC page
	// retirement or row remapping failure, 74 NVLink error, 79 GPU has
	// fallen off the bus, 95 uncontained ECC error, 119 and 120 GSP RPC
	// timeout and error, 140 unrecovered ECC error, 143 GPU initialisation
	// failure, 154 GPU recovery action changed (reset or reboot required).
	fatalXIDs = map[uint64]bool{48: true, 62: true, 64: true, 74: true, 79: true, 95: true, 119: true, 120: true, 140: true, 143: true, 154: true}
)

// ClassifyXID says whether an XID makes a GPU unhealthy and, if so,
// whether fatally. Every XID that is neither an application error nor
// fatal is a recoverable fault: NVIDIA's driver raised it as critical.
func ClassifyXID(xid uint64) (unhealthy, fatal bool) {
	if applicationXIDs[xid] {
		return false, false
	}
	return true, fatalXIDs[xid]
}

// healthEventMask is what WatchHealth registers for, where the GPU
// supports it.
const healthEventMask = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError

// WatchHealth reports the health of the GPUs with the given UUIDs until
// ctx ends:
//   - NVML events (nvmlEventSetWait): critical XIDs and double-bit ECC
//     errors, as they happen;
//   - every probeEvery, a query of each GPU (nvmlDeviceGetHandleByUUID,
//     nvmlDeviceGetMemoryInfo): ERROR_GPU_IS_LOST is the fatal "gpu-lost",
//     another error the recoverable "nvml-query-failed", success a
//     Healthy event.
//
// report is called from WatchHealth's goroutines, one call at a time.
// A GPU whose events cannot be registered is still probed; the error
// returned says which GPUs are probed only, and is returned once all
// probing has ended (ctx done).
func (l *Library) WatchHealth(ctx context.Context, uuids []string, probeEvery time.Duration, report func(HealthEvent)) error {
	events := make(chan HealthEvent, 64)
	var regErr error
	set, ret := l.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		regErr = fmt.Errorf("XID and ECC events are not watched on any GPU, only probed: %w", nvmlError("nvmlEventSetCreate", ret))
	} else {
		var errs []error
		for _, uuid := range uuids {
			if err := l.registerHealthEvents(set, uuid); err != nil {
				errs = append(errs, err)
			}
		}
		if len(errs) > 0 {
			regErr = fmt.Errorf("XID and ECC events are not watched on some GPUs, only probed: %w", errors.Join(errs...))
		}
		go l.waitEvents(ctx, set, events)
	}
	tick := time.NewTicker(probeEvery)
	defer tick.Stop()
	probe := func() {
		for _, uuid := range uuids {
			report(l.probe(uuid))
		}
	}
	probe()
	for {
		select {
		case <-ctx.Done():
			return regErr
		case ev := <-events:
			report(ev)
		case <-tick.C:
			probe()
		}
	}
}

func (l *Library) registerHealthEvents(set nvml.EventSet, uuid string) error {
	dev, ret := l.lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("GPU %s: %w", uuid, nvmlError("nvmlDeviceGetHandleByUUID", ret))
	}
	supported, ret := dev.GetSupportedEventTypes()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("GPU %s: %w", uuid, nvmlError("nvmlDeviceGetSupportedEventTypes", ret))
	}
	mask := supported & healthEventMask
	if mask == 0 {
		return fmt.Errorf("GPU %s supports neither XID nor double-bit ECC events", uuid)
	}
	if ret := dev.RegisterEvents(mask, set); ret != nvml.SUCCESS {
		return fmt.Errorf("GPU %s: %w", uuid, nvmlError("nvmlDeviceRegisterEvents", ret))
	}
	return nil
}

// waitEvents turns NVML events into HealthEvents until ctx ends, then
// frees the event set.
func (l *Library) waitEvents(ctx context.Context, set nvml.EventSet, out chan<- HealthEvent) {
	// Nothing is left to do if freeing fails: the process is stopping.
	defer func() { _ = set.Free() }()
	for ctx.Err() == nil {
		// The timeout bounds how long a cancelled ctx waits.
		data, ret := set.Wait(500)
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_TIMEOUT:
			continue
		default:
			// ERROR_GPU_IS_LOST names no GPU; the probes find which.
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		ev, ok := eventHealth(data)
		if !ok {
			continue
		}
		select {
		case out <- ev:
		case <-ctx.Done():
		}
	}
}

// eventHealth converts an NVML event; ok is false for events that do not
// make a GPU unhealthy (application XIDs).
func eventHealth(data nvml.EventData) (HealthEvent, bool) {
	if data.Device == nil {
		return HealthEvent{}, false
	}
	uuid, ret := data.Device.GetUUID()
	if ret != nvml.SUCCESS {
		return HealthEvent{}, false
	}
	ev := HealthEvent{GPU: uuid, Time: time.Now()}
	where := ""
	// NVML attributes a fault inside a MIG instance to its GPU instance;
	// 0xFFFFFFFF means the whole GPU.
	if data.GpuInstanceId != 0xFFFFFFFF && data.EventType == nvml.EventTypeXidCriticalError {
		where = fmt.Sprintf(" in GPU instance %d", data.GpuInstanceId)
	}
	switch data.EventType {
	case nvml.EventTypeXidCriticalError:
		unhealthy, fatal := ClassifyXID(data.EventData)
		if !unhealthy {
			return HealthEvent{}, false
		}
		ev.XID, ev.Fatal = data.EventData, fatal
		ev.Reason = fmt.Sprintf("xid-%d", data.EventData)
		ev.Detail = fmt.Sprintf("XID %d%s", data.EventData, where)
	case nvml.EventTypeDoubleBitEccError:
		ev.Fatal = true
		ev.Reason = "ecc-dbe"
		ev.Detail = "double-bit ECC error"
	default:
		return HealthEvent{}, false
	}
	return ev, true
}

// probe queries one GPU.
func (l *Library) probe(uuid string) HealthEvent {
	ev := HealthEvent{GPU: uuid, Time: time.Now()}
	dev, ret := l.lib.DeviceGetHandleByUUID(uuid)
	call := "nvmlDeviceGetHandleByUUID"
	if ret == nvml.SUCCESS {
		_, ret = dev.GetMemoryInfo()
		call = "nvmlDeviceGetMemoryInfo"
	}
	switch ret {
	case nvml.SUCCESS:
		ev.Healthy = true
	case nvml.ERROR_GPU_IS_LOST:
		ev.Reason, ev.Fatal = "gpu-lost", true
		ev.Detail = fmt.Sprintf("the GPU has fallen off the bus: %v", nvmlError(call, ret))
	default:
		ev.Reason = "nvml-query-failed"
		ev.Detail = fmt.Sprintf("NVML query failed: %v", nvmlError(call, ret))
	}
	return ev
}

// ProbeGPU queries one GPU the way WatchHealth's probes do; nil means it
// answered.
func (l *Library) ProbeGPU(uuid string) error {
	if ev := l.probe(uuid); !ev.Healthy {
		return errors.New(ev.Detail)
	}
	return nil
}
