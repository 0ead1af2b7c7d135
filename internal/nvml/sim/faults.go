package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/facet-gpu/facet/pkg/model/atomicfile"
)

// FaultKind is what an injected fault simulates.
type FaultKind string

const (
	// FaultXID delivers one XID event (nvmlEventSetWait,
	// EventTypeXidCriticalError) with the fault's XID.
	FaultXID FaultKind = "xid"
	// FaultECC delivers one double-bit ECC event.
	FaultECC FaultKind = "ecc-dbe"
	// FaultLost makes the GPU fall off the bus: an XID 79 event, and
	// every query of it fails with ERROR_GPU_IS_LOST until cleared.
	FaultLost FaultKind = "lost"
	// FaultQuery makes queries of the GPU fail with ERROR_UNKNOWN until
	// cleared, without an event.
	FaultQuery FaultKind = "query"
)

// FaultKinds lists the kinds, for help texts.
var FaultKinds = []FaultKind{FaultXID, FaultECC, FaultLost, FaultQuery}

// Fault is one fault injected into a simulated node.
type Fault struct {
	// Seq orders faults; InjectFault assigns it.
	Seq int `json:"seq"`
	// GPU is the NVML index.
	GPU int `json:"gpu"`
	// Kind is what is simulated.
	Kind FaultKind `json:"kind"`
	// XID is the XID number, for FaultXID.
	XID uint64 `json:"xid,omitempty"`
	// Time is when it was injected.
	Time time.Time `json:"time"`
}

// active is true for faults that last until cleared.
func (f Fault) active() bool { return f.Kind == FaultLost || f.Kind == FaultQuery }

// event is the NVML event the fault delivers, if any.
func (f Fault) event() (eventType, data uint64, ok bool) {
	switch f.Kind {
	case FaultXID:
		return nvml.EventTypeXidCriticalError, f.XID, true
	case FaultLost:
		return nvml.EventTypeXidCriticalError, 79, true
	case FaultECC:
		return nvml.EventTypeDoubleBitEccError, 0, true
	}
	return 0, 0, false
}

// FaultFileName is the fault file's name in the plugin's state directory.
const FaultFileName = "simulated-faults.json"

// WithFaultFile lets another process inject faults into the simulated
// node through a JSON file (InjectFault, ClearFaults; `facetctl fault`).
// The simulated library reads it when a query is made and, while an NVML
// event set waits, every 100 ms. Events of faults already in the file when
// the library opens are not delivered again: like NVML's, events are not
// replayed to a process that starts after them.
//
// The format (version 1):
//
//	{"version": 1, "faults": [
//	  {"seq": 1, "gpu": 0, "kind": "xid", "xid": 79, "time": "2026-11-23T16:00:00Z"},
//	  {"seq": 2, "gpu": 3, "kind": "query", "time": "..."}
//	]}
func WithFaultFile(path string) Option {
	return func(o *options) { o.faultFile = path }
}

type faultFile struct {
	Version int `json:"version"`
	// LastSeq is the highest Seq ever assigned, kept when faults are
	// cleared so that a running library, which has delivered the events
	// up to it, never sees a Seq reused.
	LastSeq int     `json:"lastSeq"`
	Faults  []Fault `json:"faults"`
}

const faultFileVersion = 1

// ReadFaults reads a fault file; a missing file has no faults.
func ReadFaults(path string) ([]Fault, error) {
	ff, err := readFaultFile(path)
	return ff.Faults, err
}

func readFaultFile(path string) (faultFile, error) {
	var ff faultFile
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return ff, nil
	}
	if err != nil {
		return ff, fmt.Errorf("fault file: %w", err)
	}
	if err := json.Unmarshal(data, &ff); err != nil {
		return ff, fmt.Errorf("fault file %s: %w", path, err)
	}
	if ff.Version != faultFileVersion {
		return ff, fmt.Errorf("fault file %s: version %d, want %d", path, ff.Version, faultFileVersion)
	}
	return ff, nil
}

func writeFaults(path string, ff faultFile) error {
	ff.Version = faultFileVersion
	return atomicfile.WriteJSON(path, ".faults-", ff, 0o644)
}

// InjectFault appends a fault to the file, validated against the
// machine's GPU count when gpus > 0, and returns it with its Seq.
func InjectFault(path string, gpus int, f Fault) (Fault, error) {
	switch f.Kind {
	case FaultXID:
		if f.XID == 0 {
			return f, errors.New("an xid fault needs its XID number")
		}
	case FaultECC, FaultLost, FaultQuery:
		if f.XID != 0 {
			return f, fmt.Errorf("a %s fault takes no XID", f.Kind)
		}
	default:
		return f, fmt.Errorf("unknown fault kind %q; want one of %v", f.Kind, FaultKinds)
	}
	if f.GPU < 0 || (gpus > 0 && f.GPU >= gpus) {
		return f, fmt.Errorf("GPU index %d: the machine has %d GPUs", f.GPU, gpus)
	}
	ff, err := readFaultFile(path)
	if err != nil {
		return f, err
	}
	ff.LastSeq++
	f.Seq = ff.LastSeq
	if f.Time.IsZero() {
		f.Time = time.Now().UTC().Truncate(time.Second)
	}
	ff.Faults = append(ff.Faults, f)
	return f, writeFaults(path, ff)
}

// ClearFaults removes every fault of GPU index gpu (all GPUs when gpu < 0),
// as a GPU reset would, and returns how many it removed.
func ClearFaults(path string, gpu int) (int, error) {
	ff, err := readFaultFile(path)
	if err != nil {
		return 0, err
	}
	var keep []Fault
	for _, f := range ff.Faults {
		if gpu >= 0 && f.GPU != gpu {
			keep = append(keep, f)
		}
	}
	n := len(ff.Faults) - len(keep)
	if n == 0 {
		return 0, nil
	}
	ff.Faults = keep
	return n, writeFaults(path, ff)
}

// faultSource serves a node's injected faults to its simulated devices.
type faultSource struct {
	path string
	mu   sync.Mutex
	// delivered is the highest Seq whose event has been delivered.
	delivered int
}

func newFaultSource(path string) (*faultSource, error) {
	ff, err := readFaultFile(path)
	if err != nil {
		return nil, err
	}
	return &faultSource{path: path, delivered: ff.LastSeq}, nil
}

// activeOn returns the lasting fault of GPU index, if any. A file that
// cannot be read counts as no faults: the test tool wrote it badly, and
// the GPU should not seem broken for it.
func (s *faultSource) activeOn(index int) (Fault, bool) {
	faults, _ := ReadFaults(s.path)
	for _, f := range faults {
		if f.GPU == index && f.active() {
			return f, true
		}
	}
	return Fault{}, false
}

// queryFails is what a query of GPU index returns while a lasting fault
// is injected on it (SUCCESS when none is): a GPU off the bus is lost,
// any other fault fails the query. A nil source has no faults.
func (s *faultSource) queryFails(index int) nvml.Return {
	if s == nil {
		return nvml.SUCCESS
	}
	f, ok := s.activeOn(index)
	switch {
	case !ok:
		return nvml.SUCCESS
	case f.Kind == FaultLost:
		return nvml.ERROR_GPU_IS_LOST
	}
	return nvml.ERROR_UNKNOWN
}

// next returns the first undelivered event of a GPU whose events are
// registered, and marks it delivered.
func (s *faultSource) next(registered func(index int, eventType uint64) bool) (Fault, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	faults, _ := ReadFaults(s.path)
	for _, f := range faults {
		if f.Seq <= s.delivered {
			continue
		}
		s.delivered = f.Seq
		if et, _, ok := f.event(); ok && registered(f.GPU, et) {
			return f, true
		}
	}
	return Fault{}, false
}

// installEvents gives the node NVML event sets and makes its GPUs' queries
// fail while a lasting fault is injected. Without a fault source events
// never come, as on a healthy GPU.
func (n *simNode) installEvents(srv *server.Server, src *faultSource) {
	var mu sync.Mutex
	// masks[index] is what the GPU's events are registered for, per set.
	masks := map[*mock.EventSet]map[int]uint64{}
	const supported = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError
	for i, g := range n.gpus {
		dev := g.dev
		dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return supported, nvml.SUCCESS }
		dev.RegisterEventsFunc = func(mask uint64, set nvml.EventSet) nvml.Return {
			s, ok := set.(*mock.EventSet)
			if !ok || mask&^supported != 0 {
				return nvml.ERROR_INVALID_ARGUMENT
			}
			mu.Lock()
			defer mu.Unlock()
			if masks[s] == nil {
				return nvml.ERROR_UNINITIALIZED
			}
			masks[s][i] |= mask
			return nvml.SUCCESS
		}
		memInfo := dev.GetMemoryInfoFunc
		dev.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
			if ret := src.queryFails(i); ret != nvml.SUCCESS {
				return nvml.Memory{}, ret
			}
			return memInfo()
		}
		memInfoV2 := dev.GetMemoryInfo_v2Func
		dev.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
			if ret := src.queryFails(i); ret != nvml.SUCCESS {
				return nvml.Memory_v2{}, ret
			}
			return memInfoV2()
		}
	}
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		s := &mock.EventSet{}
		mu.Lock()
		masks[s] = map[int]uint64{}
		mu.Unlock()
		s.FreeFunc = func() nvml.Return {
			mu.Lock()
			defer mu.Unlock()
			delete(masks, s)
			return nvml.SUCCESS
		}
		s.WaitFunc = func(timeoutMs uint32) (nvml.EventData, nvml.Return) {
			registered := func(index int, et uint64) bool {
				mu.Lock()
				defer mu.Unlock()
				return index >= 0 && masks[s][index]&et != 0
			}
			deadline := time.Now().Add(time.Duration(timeoutMs) * time.Millisecond)
			for {
				if src != nil {
					if f, ok := src.next(registered); ok {
						et, data, _ := f.event()
						return nvml.EventData{
							Device: n.gpus[f.GPU].dev, EventType: et, EventData: data,
							GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF,
						}, nvml.SUCCESS
					}
				}
				left := time.Until(deadline)
				if left <= 0 {
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
				time.Sleep(min(left, 100*time.Millisecond))
			}
		}
		return s, nvml.SUCCESS
	}
}
