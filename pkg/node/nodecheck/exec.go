package nodecheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"

	"github.com/facet-gpu/facet/pkg/node/nodecheck/probe"
)

// ExecProber runs the probe as a process of its own: Path with Args, then
// --libcuda and --params (probe.Command's flags), in exactly the claim's
// environment, nothing of the caller's. A process of its own is what a
// container is to HAMi-core: libvgpu.so is preloaded at its start, and its
// CUDA context and accounting end with it.
type ExecProber struct {
	Path string
	Args []string
}

// Probe runs the probe and decodes its output. A probe that measured
// something before it failed returns that with the error.
func (e ExecProber) Probe(ctx context.Context, env []string, libCUDA string, p probe.Params) (*probe.Result, error) {
	params, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, e.Path, append(append([]string(nil), e.Args...), "--libcuda", libCUDA, "--params", string(params))...)
	cmd.Env = env
	if len(p.Binds) > 0 {
		// Its binds stay in its own mount namespace (Go makes the
		// mounts private there before exec).
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var out probe.Output
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		return nil, fmt.Errorf("probe process %s: %w; output: %s", e.Path, errors.Join(runErr, err), tail(stdout.String()+stderr.String()))
	}
	if out.Error != "" {
		return &out.Result, errors.New(out.Error)
	}
	if runErr != nil {
		return &out.Result, fmt.Errorf("probe process: %w; stderr: %s", runErr, tail(stderr.String()))
	}
	return &out.Result, nil
}

// tail is the end of a process's output, for an error message.
func tail(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 800 {
		s = "..." + s[len(s)-800:]
	}
	return s
}
