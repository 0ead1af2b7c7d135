package imex

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"time"

	"github.com/facet-gpu/facet/pkg/node/driverroot"
)

// Ready is what nvidia-imex-ctl -q prints when the node's daemon is ready,
// and what the probe prints then.
const Ready = "READY"

// Probe says whether the daemon that keeps stateDir is ready: nil, or an
// error saying why not, which the probe prints for the kubelet's
// "Readiness probe failed" Event. Ready means: the state was written by a
// facet-imex that still runs (its PID and start time), it says ready, and
// with nvidia-imex, nvidia-imex-ctl -c <configuration> -q, run chrooted
// as nvidia-imex runs, prints READY (NVIDIA's compute-domain daemon's
// check, cmd/compute-domain-daemon/main.go). timeout bounds
// nvidia-imex-ctl.
func Probe(ctx context.Context, stateDir string, timeout time.Duration) error {
	s, err := ReadState(stateDir)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("facet-imex has written no state in %s yet", stateDir)
	}
	if err != nil {
		return err
	}
	if st, err := procStartTime(s.PID); err != nil || st != s.StartTime {
		return fmt.Errorf("the facet-imex that wrote %s/%s (pid %d) no longer runs", stateDir, StateName, s.PID)
	}
	if !s.Ready {
		return errors.New(s.Reason)
	}
	switch s.Mode {
	case ModeSimulate:
		return nil
	case ModeIMEX:
	default:
		return fmt.Errorf("%s/%s: unknown mode %q", stateDir, StateName, s.Mode)
	}
	if s.IMEX == nil {
		return fmt.Errorf("%s/%s: ready without nvidia-imex's layout", stateDir, StateName)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	l := driverroot.Layout{Root: s.IMEX.Root, Path: s.IMEX.Ctl, LibraryPath: s.IMEX.LibraryPath}
	cmd := driverroot.Command(ctx, chrootSpec(l, stateDir, "-c", ChrootStateDir+"/"+ConfigName, "-q"))
	cmd.Env = programEnv(l)
	out, err := cmd.CombinedOutput()
	out = bytes.TrimSpace(out)
	if err != nil {
		return fmt.Errorf("%s -c %s/%s -q (chrooted into %s): %w: %s%s", l.Path, ChrootStateDir, ConfigName, l.Root, err, out, driverroot.LaunchHint(err))
	}
	if string(out) != Ready {
		return fmt.Errorf("nvidia-imex is not ready: nvidia-imex-ctl -q says %q", out)
	}
	return nil
}

// ProbeMain is `facet-imex probe [--state-dir DIR] [--timeout D]`: it
// prints READY and returns 0, or prints why not and returns 1 (2: wrong
// flags). The kubelet's exec probe reads both.
func ProbeMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("facet-imex probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	stateDir := fs.String("state-dir", DefaultStateDir, "facet-imex's state directory, as its --state-dir")
	timeout := fs.Duration("timeout", 10*time.Second, "how long nvidia-imex-ctl -q may take")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "facet-imex probe: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if err := Probe(ctx, *stateDir, *timeout); err != nil {
		fmt.Fprintf(stdout, "not ready: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, Ready)
	return 0
}
