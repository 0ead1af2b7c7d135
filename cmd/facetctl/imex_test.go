package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestIMEXChannels runs `facetctl imex-channels` on proc roots laid out as
// a driver's (pkg/model/nvmlgpu/testdata/imex) and dev roots with and
// without channel nodes.
func TestIMEXChannels(t *testing.T) {
	proc := func(name string) string {
		return filepath.Join("..", "..", "pkg", "model", "nvmlgpu", "testdata", "imex", name)
	}
	withNode := func(major, minor uint32) string {
		root := t.TempDir()
		dir := filepath.Join(root, "dev", "nvidia-caps-imex-channels")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mknod(filepath.Join(dir, "channel0"), unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor))); err != nil {
			if errors.Is(err, os.ErrPermission) {
				t.Skipf("mknod needs root: %v", err)
			}
			t.Fatal(err)
		}
		return root
	}
	for _, tc := range []struct {
		name, proc, dev string
		want, wantErr   string
	}{
		{name: "no nodes", proc: proc("r580-default"), dev: t.TempDir(),
			want: "nvidia-caps-imex-channels: major 242 (" + proc("r580-default") + "/devices), 2048 channels (" + proc("r580-default") + "/driver/nvidia/params)\nchannel device nodes on this host: 0"},
		{name: "channel0 as the driver made it", proc: proc("r580-16-channels"), dev: withNode(242, 0),
			want: "16 channels", wantErr: ""},
		{name: "channel0 of another major", proc: proc("r580-default"), dev: withNode(241, 0),
			want: "channel0  c 241:0  major 241, but nvidia-caps-imex-channels is 242", wantErr: "1 channel device nodes disagree"},
		{name: "no channels", proc: proc("channels-disabled"), dev: t.TempDir(), wantErr: "the driver offers no IMEX channels"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := runIMEXChannels([]string{"--proc-root", tc.proc, "--dev-root", tc.dev}, &out)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
			if !strings.Contains(out.String(), tc.want) {
				t.Errorf("output:\n%s\nwant %q", out.String(), tc.want)
			}
		})
	}
}
