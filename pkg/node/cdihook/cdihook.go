// Package cdihook checks and installs nvidia-cdi-hook, the NVIDIA Container
// Toolkit's program that the hooks of every CDI spec Facet writes run
// (create-symlinks, update-ldcache, enable-cuda-compat,
// disable-device-node-modification; see nvml.DriverEditor). The container
// runtime runs it from the host path the spec names, so a spec naming a
// path that does not exist, or a program that does not run there, fails
// every container created from it, and only at container creation. Check
// lets the plugin refuse to start instead; Install puts Facet's own copy on
// the host, for nodes without the NVIDIA Container Toolkit (the chart's init
// container runs it through `facetctl install-cdi-hook`).
package cdihook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/facet-gpu/facet/pkg/model/atomicfile"
)

// Name is the hook's file name. nvcdi derives the hooks' argv[0] from the
// base name of the path, and nvidia-cdi-hook dispatches on it.
const Name = "nvidia-cdi-hook"

// ImagePath is where Facet's image has its nvidia-cdi-hook (hack/image.sh),
// the source Install copies by default.
const ImagePath = "/usr/bin/" + Name

// Reason is the reason of the Warning Event on the Node when the plugin
// refuses to start because of its hook.
const Reason = "FacetCDIHookUnusable"

// DefaultTimeout bounds one run of the hook in Check.
const DefaultTimeout = 10 * time.Second

// How to point the plugin at a hook that runs: the flag, and the chart's
// values. Error messages name them.
const (
	Flag             = "--nvidia-cdi-hook"
	ChartInstallVal  = "kubeletPlugin.nvidiaCDIHook.install=true"
	ChartHostPathVal = "kubeletPlugin.driver.nvidiaCDIHookPath"
)

// Options says which hook Check checks.
type Options struct {
	// HostPath is the absolute host path the CDI specs name (the plugin's
	// --nvidia-cdi-hook). Its base name must be Name.
	HostPath string
	// Path is where this process sees HostPath: in the plugin's container,
	// a mount of the host file's directory. Empty means HostPath (a process
	// on the host, or a mount at the same path).
	Path string
	// Timeout bounds the run of `<hook> --version`; zero means
	// DefaultTimeout.
	Timeout time.Duration
}

// Error is why the hook cannot serve the specs. Its message names the
// host path, what is wrong, and the flag and chart values that fix it.
type Error struct {
	HostPath string
	// Path is where this process looked, when it differs from HostPath.
	Path   string
	Reason string
	Err    error
}

func (e *Error) Error() string {
	where := e.HostPath
	if e.Path != "" && e.Path != e.HostPath {
		where = fmt.Sprintf("%s (seen by the plugin at %s)", e.HostPath, e.Path)
	}
	return fmt.Sprintf("%s at host path %s %s: the hooks of every CDI spec the plugin writes run it, so no container could start with a device of this node. "+
		"Install the NVIDIA Container Toolkit's nvidia-cdi-hook there, or point the plugin at one that runs with %s=<host path>; "+
		"with the Helm chart, set %s (the chart installs Facet's copy on the node) or %s",
		Name, where, e.Reason, Flag, ChartInstallVal, ChartHostPathVal)
}

func (e *Error) Unwrap() error { return e.Err }

// Check reports whether the hook at o.HostPath can serve the CDI specs: its
// base name is Name, the file exists (looked up at o.Path) as a regular
// file with an execute bit, and `<hook> --version` runs and exits 0 within
// the timeout, which nvidia-cdi-hook answers without touching anything. It
// returns the first line of that output (e.g. "NVIDIA CDI Hook version
// 1.19.1"), or an *Error.
func Check(ctx context.Context, o Options) (string, error) {
	fail := func(reason string, err error) (string, error) {
		return "", &Error{HostPath: o.HostPath, Path: o.Path, Reason: reason, Err: err}
	}
	if !filepath.IsAbs(o.HostPath) {
		return fail("is not an absolute path", nil)
	}
	if filepath.Base(o.HostPath) != Name {
		return fail(fmt.Sprintf("is not named %s (nvcdi derives the hooks' program name from the file name)", Name), nil)
	}
	path := o.Path
	if path == "" {
		path = o.HostPath
	}
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fail("does not exist", err)
	case err != nil:
		return fail(fmt.Sprintf("cannot be read (%v)", err), err)
	case !fi.Mode().IsRegular():
		return fail(fmt.Sprintf("is not a regular file (%s)", fi.Mode().Type()), nil)
	case fi.Mode().Perm()&0o111 == 0:
		return fail(fmt.Sprintf("is not executable (mode %s)", fi.Mode().Perm()), nil)
	}
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "--version")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// A child that keeps the output open must not hold Check past its
	// timeout.
	cmd.WaitDelay = time.Second
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	err = cmd.Run()
	text := strings.TrimSpace(out.String())
	if len(text) > 512 {
		text = text[:512] + "..."
	}
	switch {
	case ctx.Err() != nil:
		return fail(fmt.Sprintf("did not answer --version within %s", timeout), ctx.Err())
	case err != nil:
		return fail(fmt.Sprintf("does not run (--version: %v: %q)", err, text), err)
	}
	first, _, _ := strings.Cut(text, "\n")
	return first, nil
}

// Install copies the nvidia-cdi-hook at src into dir as dir/Name, then
// Checks the copy. A file already there with the same bytes is kept;
// otherwise the new one is written next to it and renamed over it, so that
// a container runtime running the old one keeps its file. It returns
// whether it wrote the file, and the hook's version line.
func Install(ctx context.Context, src, dir string) (wrote bool, version string, err error) {
	if !filepath.IsAbs(dir) {
		return false, "", fmt.Errorf("install %s: directory %q is not an absolute path", Name, dir)
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return false, "", fmt.Errorf("install %s: %w", Name, err)
	}
	dest := filepath.Join(dir, Name)
	if old, err := os.ReadFile(dest); err == nil && bytes.Equal(old, data) {
		if fi, err := os.Stat(dest); err == nil && fi.Mode().Perm() == 0o755 {
			version, err := Check(ctx, Options{HostPath: dest})
			return false, version, err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, "", fmt.Errorf("install %s: %w", Name, err)
	}
	// Atomic and durable: a node rebooted mid-install keeps the old hook
	// or the new one, never half of one that every container start runs.
	if err := atomicfile.WriteWith(dir, Name, data, atomicfile.Options{TempPattern: "." + Name + ".tmp.*", Perm: 0o755}); err != nil {
		return false, "", fmt.Errorf("install %s: %w", Name, err)
	}
	version, err = Check(ctx, Options{HostPath: dest})
	return true, version, err
}
