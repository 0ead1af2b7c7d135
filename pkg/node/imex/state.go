package imex

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/facet-gpu/facet/pkg/model/atomicfile"
)

// Modes of State.Mode.
const (
	// ModeIMEX runs NVIDIA's nvidia-imex.
	ModeIMEX = "nvidia-imex"
	// ModeSimulate is the stand-in (--simulate).
	ModeSimulate = "simulate"
)

// State is what facet-imex last knew, in the state directory's
// state.json, for `facet-imex probe`. facet-imex writes it first thing
// at each start (not ready), so a state left by the container's last run
// in the same directory (an emptyDir outlives a container restart) is
// never read as this run's; the probe also checks that the process that
// wrote it still runs (PID and StartTime).
type State struct {
	// Mode is ModeIMEX or ModeSimulate.
	Mode string `json:"mode"`
	// PID is facet-imex's process ID, and StartTime its start time in
	// clock ticks since boot (/proc/<pid>/stat field 22): the pair names
	// the process even where PIDs restart at 1 with every container.
	PID       int    `json:"pid"`
	StartTime uint64 `json:"startTime"`
	// Domain is "<namespace>/<name>", UID its metadata.uid, Node this
	// node's name.
	Domain string `json:"domain"`
	UID    string `json:"uid"`
	Node   string `json:"node"`
	// ResourceVersion is the version of the domain last acted on, empty
	// before the first or once it is gone.
	ResourceVersion string `json:"resourceVersion,omitempty"`
	// Ready: in ModeSimulate the stand-in's verdict; in ModeIMEX whether
	// nvidia-imex is started (nvidia-imex-ctl -q then decides).
	Ready bool `json:"ready"`
	// Reason says why not Ready, e.g. "ComputeDomain ml/train: the peer
	// list holds 3 of spec.numNodes 4 nodes (a, b, c)".
	Reason string `json:"reason,omitempty"`
	// Peers is the peer list written, one address an entry.
	Peers []string `json:"peers"`
	// IMEX is how nvidia-imex runs, in ModeIMEX once started.
	IMEX *IMEXState `json:"imex,omitempty"`
}

// IMEXState is where nvidia-imex and nvidia-imex-ctl run, so the probe
// runs the control program as the daemon runs nvidia-imex.
type IMEXState struct {
	// Root is the root both run chrooted into, as facet-imex sees it;
	// Ctl nvidia-imex-ctl's path inside it; LibraryPath their
	// LD_LIBRARY_PATH inside it, empty for none (driverroot.Layout).
	Root        string `json:"root"`
	Ctl         string `json:"ctl"`
	LibraryPath string `json:"libraryPath,omitempty"`
	// PID is nvidia-imex's process ID.
	PID int `json:"pid"`
	// Reloads counts the SIGUSR1 sent to it, one per change of the peer
	// list that it did not read at start (changes within ReloadInterval
	// share one).
	Reloads int `json:"reloads"`
}

// WriteState replaces dir/state.json with s, atomically (a probe reads
// the old or the new state, never a mix).
func WriteState(dir string, s State) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteWith(dir, StateName, append(b, '\n'), atomicfile.Options{TempPattern: tempPrefix + "*", Perm: 0o644, NoSync: true})
}

// ReadState reads dir/state.json. The error names the file.
func ReadState(dir string) (State, error) {
	var s State
	p := filepath.Join(dir, StateName)
	b, err := os.ReadFile(p)
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("%s: %w", p, err)
	}
	return s, nil
}

// procStartTime is pid's start time in clock ticks since boot, field 22
// of /proc/<pid>/stat (proc(5)); the fields after the command name, which
// may hold spaces and parentheses, are counted from its last ")".
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("no command name in /proc/" + strconv.Itoa(pid) + "/stat")
	}
	// After ") ": field 3 (state) onwards; starttime is field 22.
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat has %d fields after the command name, want 20 or more", pid, len(fields))
	}
	return strconv.ParseUint(fields[19], 10, 64)
}
