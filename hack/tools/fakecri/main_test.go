package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
)

// standIn is the programs' stand-in: "serve DIR" writes its arguments and
// $FOO into DIR/args and runs until SIGTERM (then writes DIR/stopped);
// "crash" exits 3; "probe DIR" prints DIR/ready and exits 0, or prints
// "not ready" and exits 1.
const standIn = `#!/bin/sh
case "$1" in
serve)
	echo "$@ FOO=$FOO DIR=$DIR" >"$2/args"
	trap 'echo term >"$2/stopped"; exit 0' TERM
	while :; do sleep 0.02; done ;;
crash) echo crashing; exit 3 ;;
probe) cat "$2/ready" 2>/dev/null && exit 0; echo "not ready"; exit 1 ;;
esac
exit 2
`

const simImage = "facet.local/facet:0.1.0-sim"

// newTestRuntime is a runtime in exec mode for facet.local/facet:*-sim,
// whose programs are standIn named stand-in.
func newTestRuntime(t *testing.T) *runtime {
	t.Helper()
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "stand-in"), []byte(standIn), 0o755); err != nil {
		t.Fatal(err)
	}
	fr := fake.NewFakeRemoteRuntime()
	em, err := newExecMode(fr, "facet.local/facet:*-sim, other/*", bin, t.TempDir(), []string{"FOO=from-fakecri"})
	if err != nil {
		t.Fatal(err)
	}
	rt := &runtime{RemoteRuntime: fr, exec: em}
	t.Cleanup(func() {
		for _, ec := range em.all() {
			ec.stop(0)
		}
	})
	return rt
}

// sandbox runs a pod sandbox and returns its ID.
func sandbox(t *testing.T, rt *runtime, pod string) string {
	t.Helper()
	resp, err := rt.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: pod, Namespace: "facet", Uid: pod + "-uid"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetPodSandboxId()
}

// create creates container "c" in sb with the image, command and mounts.
func create(t *testing.T, rt *runtime, sb, image string, attempt uint32, cmd []string, mounts ...*runtimeapi.Mount) (string, error) {
	t.Helper()
	resp, err := rt.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{
		PodSandboxId: sb,
		Config: &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: "c", Attempt: attempt},
			Image:    &runtimeapi.ImageSpec{Image: image},
			Command:  cmd[:1],
			Args:     cmd[1:],
			Envs:     []*runtimeapi.KeyValue{{Key: "FOO", Value: "from-pod"}, {Key: "DIR", Value: "/state/sub"}},
			Mounts:   mounts,
			Labels:   map[string]string{labelPodNamespace: "facet", labelPodName: "p", labelContainerName: "c"},
		},
	})
	return resp.GetContainerId(), err
}

// status is the container's CRI status.
func status(t *testing.T, rt *runtime, id string) *runtimeapi.ContainerStatus {
	t.Helper()
	resp, err := rt.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetStatus()
}

// waitFor polls cond every 10 ms for up to 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s", what)
		}
	}
}

// TestExecContainer: a container of an exec image runs as a process with
// its mounts' paths rewritten and its environment; ExecSync runs the
// probe the same way and returns its output and exit code; StopContainer
// ends it with SIGTERM and the status says how it ended.
func TestExecContainer(t *testing.T) {
	rt := newTestRuntime(t)
	state := t.TempDir()
	mounts := []*runtimeapi.Mount{{ContainerPath: "/state", HostPath: state}, {ContainerPath: "/state/deeper", HostPath: "/elsewhere"}}
	sb := sandbox(t, rt, "p")
	id, err := create(t, rt, sb, simImage, 0, []string{"/usr/bin/stand-in", "serve", "/state", "--flag=/state/x", "/stateful", "plain"}, mounts...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.StartContainer(context.Background(), &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	if s := status(t, rt, id); s.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("state %v", s.GetState())
	}
	argsFile := filepath.Join(state, "args")
	waitFor(t, "the process's args file", func() bool { _, err := os.Stat(argsFile); return err == nil })
	got, _ := os.ReadFile(argsFile)
	want := "serve " + state + " --flag=" + state + "/x /stateful plain FOO=from-fakecri DIR=" + state + "/sub\n"
	if string(got) != want {
		t.Errorf("the process saw %q, want %q", got, want)
	}

	probe := func() *runtimeapi.ExecSyncResponse {
		t.Helper()
		resp, err := rt.ExecSync(context.Background(), &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"stand-in", "probe", "/state"}, Timeout: 5})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if r := probe(); r.GetExitCode() != 1 || string(r.GetStdout()) != "not ready\n" {
		t.Errorf("probe before ready: %d %q", r.GetExitCode(), r.GetStdout())
	}
	if err := os.WriteFile(filepath.Join(state, "ready"), []byte("READY\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := probe(); r.GetExitCode() != 0 || string(r.GetStdout()) != "READY\n" {
		t.Errorf("probe when ready: %d %q", r.GetExitCode(), r.GetStdout())
	}
	if _, err := rt.ExecSync(context.Background(), &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"no-such-program"}}); err == nil || !strings.Contains(err.Error(), "no program no-such-program in --exec-bin-dir") {
		t.Errorf("exec of a missing program: %v", err)
	}

	if _, err := rt.StopContainer(context.Background(), &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 10}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(state, "stopped")); err != nil || string(b) != "term\n" {
		t.Errorf("no SIGTERM reached the process: %q %v", b, err)
	}
	if s := status(t, rt, id); s.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED || s.GetExitCode() != 0 || s.GetReason() != "Completed" {
		t.Errorf("after StopContainer: %v exit %d %q", s.GetState(), s.GetExitCode(), s.GetReason())
	}
	if _, err := rt.ExecSync(context.Background(), &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"stand-in", "probe", "/state"}}); err == nil || !strings.Contains(err.Error(), "is not running") {
		t.Errorf("exec in a stopped container: %v", err)
	}
	if _, err := rt.RemoveContainer(context.Background(), &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	if rt.exec.get(id) != nil {
		t.Error("a removed container is still known")
	}
}

// TestExecContainerCrash: a process that exits by itself leaves the
// container exited with its code and reason Error, for the kubelet to
// restart; the restart (next attempt) runs again; a sandbox stopped with a
// running container leaves no process.
func TestExecContainerCrash(t *testing.T) {
	rt := newTestRuntime(t)
	sb := sandbox(t, rt, "p")
	id, err := create(t, rt, sb, simImage, 0, []string{"stand-in", "crash"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.StartContainer(context.Background(), &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the crash", func() bool { return status(t, rt, id).GetState() == runtimeapi.ContainerState_CONTAINER_EXITED })
	if s := status(t, rt, id); s.GetExitCode() != 3 || s.GetReason() != "Error" || s.GetFinishedAt() == 0 {
		t.Errorf("after the crash: exit %d %q finished %d", s.GetExitCode(), s.GetReason(), s.GetFinishedAt())
	}
	b, _ := os.ReadFile(filepath.Join(rt.exec.logDir, "facet_p_c_0.log"))
	if string(b) != "crashing\n" {
		t.Errorf("the process's log: %q", b)
	}

	state := t.TempDir()
	id2, err := create(t, rt, sb, simImage, 1, []string{"stand-in", "serve", "/s"}, &runtimeapi.Mount{ContainerPath: "/s", HostPath: state})
	if err != nil || id2 == id {
		t.Fatalf("the restart's container: %q %v", id2, err)
	}
	if _, err := rt.StartContainer(context.Background(), &runtimeapi.StartContainerRequest{ContainerId: id2}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the restart running", func() bool { _, err := os.Stat(filepath.Join(state, "args")); return err == nil })
	ec := rt.exec.get(id2)
	if _, err := rt.StopPodSandbox(context.Background(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb}); err != nil {
		t.Fatal(err)
	}
	if ec.running() {
		t.Error("a process outlived its stopped sandbox")
	}
	if s := status(t, rt, id2); s.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED || s.GetExitCode() != 128+9 {
		t.Errorf("after the sandbox stopped: %v exit %d", s.GetState(), s.GetExitCode())
	}
}

// TestOtherImages: the containers of other images never run, as before
// exec mode; an exec image without a command or program is refused.
func TestOtherImages(t *testing.T) {
	rt := newTestRuntime(t)
	sb := sandbox(t, rt, "p")
	id, err := create(t, rt, sb, "facet.local/busybox:1", 0, []string{"stand-in", "crash"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.StartContainer(context.Background(), &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	if rt.exec.get(id) != nil {
		t.Fatal("a busybox container runs in exec mode")
	}
	if s := status(t, rt, id); s.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("busybox container: %v", s.GetState())
	}
	if r, err := rt.ExecSync(context.Background(), &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"stand-in", "probe", "/x"}}); err != nil || r.GetExitCode() != 0 {
		t.Errorf("exec in a busybox container: %v %v", r, err)
	}
	for _, tc := range []struct {
		name  string
		image string
		cmd   []string
		want  string
	}{
		{name: "no command", image: simImage, cmd: []string{""}, want: "image facet.local/facet:0.1.0-sim, container facet_p_c_7: no command: the fake runtime knows no image entrypoint"},
		{name: "no such program", image: "other/thing", cmd: []string{"/bin/facet-nothing", "x"}, want: "fakecri exec mode: image other/thing, container facet_p_c_7: command \"/bin/facet-nothing\": no program facet-nothing in --exec-bin-dir"},
	} {
		if _, err := create(t, rt, sb, tc.image, 7, tc.cmd); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := rt.exec.command(nil, nil); err == nil || !strings.Contains(err.Error(), "knows no image entrypoint") {
		t.Errorf("an empty command: %v", err)
	}
}

func TestRewrite(t *testing.T) {
	mounts := []*runtimeapi.Mount{
		{ContainerPath: "/run/facet-imex", HostPath: "/var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/state"},
		{ContainerPath: "/run/facet-imex/deeper/", HostPath: "/host/deeper"},
		{ContainerPath: "/etc/hosts", HostPath: "/var/lib/kubelet/pods/u/etc-hosts"},
	}
	for in, want := range map[string]string{
		"/run/facet-imex":                  "/var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/state",
		"/run/facet-imex/state.json":       "/var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/state/state.json",
		"--state-dir=/run/facet-imex":      "--state-dir=/var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/state",
		"/run/facet-imex/deeper/x":         "/host/deeper/x",
		"/run/facet-imexx":                 "/run/facet-imexx",
		"/etc/hosts":                       "/var/lib/kubelet/pods/u/etc-hosts",
		"relative/run/facet-imex":          "relative/run/facet-imex",
		"--name=value":                     "--name=value",
		"NODE_NAME":                        "NODE_NAME",
		"":                                 "",
		"a=b=/run/facet-imex":              "a=b=/run/facet-imex",
		"--kubeconfig=/etc/kubernetes/cfg": "--kubeconfig=/etc/kubernetes/cfg",
	} {
		if got := rewrite(in, mounts); got != want {
			t.Errorf("rewrite(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestNewExecModeFlags(t *testing.T) {
	fr := fake.NewFakeRemoteRuntime()
	dir := t.TempDir()
	for _, tc := range []struct {
		name              string
		images, bin, logs string
		env               []string
		want              string
	}{
		{name: "bad pattern", images: "a[", bin: dir, logs: dir, want: `--exec-images "a["`},
		{name: "no bin dir", images: "a", logs: dir, want: `--exec-bin-dir "": exec mode needs an absolute directory`},
		{name: "relative log dir", images: "a", bin: dir, logs: "logs", want: `--exec-log-dir "logs"`},
		{name: "bin dir missing", images: "a", bin: filepath.Join(dir, "none"), logs: dir, want: "not a directory"},
		{name: "env without =", images: "a", bin: dir, logs: dir, env: []string{"KUBECONFIG"}, want: `--exec-env "KUBECONFIG": want KEY=VALUE`},
	} {
		if _, err := newExecMode(fr, tc.images, tc.bin, tc.logs, tc.env); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
