package nvmlgpu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReadIMEXChannels reads the proc roots of testdata/imex. Their
// /proc/devices carry the two lines a real H200 (driver 580.159.04) listed,
// "241 nvidia-caps" and "242 nvidia-caps-imex-channels"
// (docs/driver-roots.md), among other drivers' lines; the params files
// are laid out as the driver prints /proc/driver/nvidia/params ("Key:
// value" a line), with ImexChannelCount as each case needs it.
func TestReadIMEXChannels(t *testing.T) {
	for _, tc := range []struct {
		dir       string
		want      *IMEXChannels
		countFrom string
		wantErr   string
	}{
		{dir: "r580-default", want: &IMEXChannels{Major: 242, Count: 2048}, countFrom: "params"},
		{dir: "r580-16-channels", want: &IMEXChannels{Major: 242, Count: 16}, countFrom: "params"},
		{dir: "params-without-count", want: &IMEXChannels{Major: 242, Count: DefaultIMEXChannelCount}, countFrom: "driver default"},
		// NVreg_ImexChannelCount=0: the driver registers no major.
		{dir: "channels-disabled"},
		// A block device of that name is not the channels' driver.
		{dir: "no-driver"},
		{dir: "zero-count-with-major", wantErr: "params: ImexChannelCount is 0, but"},
		{dir: "count-not-a-number", wantErr: `params: ImexChannelCount "lots" is not a number`},
		{dir: "no-params", wantErr: "IMEX channel count: open"},
		{dir: "no-such-root", wantErr: "the nvidia-caps-imex-channels device major: open"},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			root := filepath.Join("testdata", "imex", tc.dir)
			got, err := ReadIMEXChannels(root)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ReadIMEXChannels = %+v, %v; want an error with %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == nil {
				if got != nil {
					t.Fatalf("ReadIMEXChannels = %+v, want none", got)
				}
				return
			}
			if got == nil || got.Major != tc.want.Major || got.Count != tc.want.Count {
				t.Fatalf("ReadIMEXChannels = %+v, want major %d, %d channels", got, tc.want.Major, tc.want.Count)
			}
			if got.Source != filepath.Join(root, "devices") {
				t.Errorf("Source %q", got.Source)
			}
			want := filepath.Join(root, "driver", "nvidia", "params")
			if tc.countFrom != "params" {
				want = tc.countFrom
			}
			if got.CountFrom != want {
				t.Errorf("CountFrom %q, want %q", got.CountFrom, want)
			}
		})
	}
}

// TestIMEXChannelDeviceNode: channel N is minor N of the driver's major,
// at /dev/nvidia-caps-imex-channels/channel<N>, mode 0666, with no host
// path; a channel beyond the count is refused.
func TestIMEXChannelDeviceNode(t *testing.T) {
	c := IMEXChannels{Major: 242, Count: 16}
	for _, tc := range []struct {
		n       int
		path    string
		wantErr string
	}{
		{n: 0, path: "/dev/nvidia-caps-imex-channels/channel0"},
		{n: 15, path: "/dev/nvidia-caps-imex-channels/channel15"},
		{n: 16, wantErr: "IMEX channel 16: the driver offers channels 0-15"},
		{n: -1, wantErr: "IMEX channel -1"},
	} {
		d, err := c.DeviceNode(tc.n)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("DeviceNode(%d) = %+v, %v; want %q", tc.n, d, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if d.Path != tc.path || d.HostPath != "" || d.Type != "c" || d.Major != 242 || d.Minor != int64(tc.n) || d.FileMode == nil || *d.FileMode != os.FileMode(0o666) {
			t.Errorf("DeviceNode(%d) = %+v, want c 242:%d at %s mode 0666", tc.n, *d, tc.n, tc.path)
		}
	}
}

// TestCheckIMEXChannelNodes: the channel nodes a host has are checked
// against the driver's numbers, read only; none at all is fine. Device
// nodes need mknod, so the cases that make them need root.
func TestCheckIMEXChannelNodes(t *testing.T) {
	c := &IMEXChannels{Major: 242, Count: 16}
	if nodes, err := CheckIMEXChannelNodes(t.TempDir(), c); err != nil || len(nodes) != 0 {
		t.Fatalf("no directory: %v, %v; want nothing", nodes, err)
	}
	root := t.TempDir()
	dir := filepath.Join(root, IMEXChannelDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	mk := func(name string, major, minor uint32) {
		if err := unix.Mknod(filepath.Join(dir, name), unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor))); err != nil {
			if errors.Is(err, os.ErrPermission) {
				t.Skipf("mknod needs root: %v", err)
			}
			t.Fatal(err)
		}
	}
	mk("channel0", 242, 0)
	mk("channel3", 242, 3)
	mk("channel1", 241, 1)
	mk("channel2", 242, 5)
	mk("channel20", 242, 20)
	mk("imex", 242, 0)
	if err := os.WriteFile(filepath.Join(dir, "channel4"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	nodes, err := CheckIMEXChannelNodes(root, c)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, n := range nodes {
		got[filepath.Base(n.Path)] = fmt.Sprintf("%d %d:%d %s", n.Channel, n.Major, n.Minor, n.Problem)
	}
	want := map[string]string{
		"channel0":  "0 242:0 ",
		"channel3":  "3 242:3 ",
		"channel1":  "1 241:1 major 241, but nvidia-caps-imex-channels is 242",
		"channel2":  "2 242:5 minor 5, but channel 2 is minor 2",
		"channel20": "20 242:20 the driver offers channels 0-15",
		"imex":      "-1 242:0 its name is not channel<N>",
		"channel4":  "4 0:0 not a character device",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("nodes\n%v\nwant\n%v", got, want)
	}
}
