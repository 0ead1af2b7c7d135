package nvmlgpu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeProc lays out a proc root with the given files (path below it ->
// contents).
func writeProc(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for rel, data := range files {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o444); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// A real driver's files (580 series): /proc/devices has nvidia-caps at a
// dynamic major, and the access files print the mode in decimal.
const (
	procDevices = `Character devices:
  1 mem
  4 /dev/vc/0
195 nvidia-frontend
237 nvidia-caps-imex-channels
238 nvidia-caps
510 nvidia-uvm

Block devices:
  8 sd
239 nvidia-caps
`
	migMinors = "config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu0/gi1/ci2/access 15\n"
)

func access(minor string, mode string) string {
	s := "DeviceFileMinor: " + minor + "\n"
	if mode != "" {
		s += "DeviceFileMode: " + mode + "\n"
	}
	return s + "DeviceFileModify: 1\n"
}

func TestReadMIGCapDevices(t *testing.T) {
	good := map[string]string{
		"devices":                       procDevices,
		"driver/nvidia-caps/mig-minors": migMinors,
		"driver/nvidia/capabilities/gpu0/mig/gi1/access":     access("12", "292"),
		"driver/nvidia/capabilities/gpu0/mig/gi1/ci2/access": access("15", "256"),
	}
	with := func(rel, data string) map[string]string {
		m := map[string]string{}
		for k, v := range good {
			m[k] = v
		}
		if data == "" {
			delete(m, rel)
		} else {
			m[rel] = data
		}
		return m
	}
	for _, tc := range []struct {
		name    string
		files   map[string]string
		gi, ci  int
		wantErr string
	}{
		{name: "GI 1 CI 2", files: good, gi: 1, ci: 2},
		{name: "no nvidia-caps driver", files: with("devices", "Character devices:\n  1 mem\n\nBlock devices:\n239 nvidia-caps\n"), gi: 1, ci: 2, wantErr: "lists no character device nvidia-caps"},
		{name: "no mig-minors", files: with("driver/nvidia-caps/mig-minors", ""), gi: 1, ci: 2, wantErr: "mig-minors"},
		{name: "malformed mig-minors", files: with("driver/nvidia-caps/mig-minors", "config 1\ngpu0/gi1/access\n"), gi: 1, ci: 2, wantErr: "line 2"},
		{name: "no such instance", files: good, gi: 1, ci: 3, wantErr: "gi1/ci3/access"},
		{name: "no minor in the access file", files: with("driver/nvidia/capabilities/gpu0/mig/gi1/access", "DeviceFileMode: 292\n"), gi: 1, ci: 2, wantErr: "no DeviceFileMinor"},
		{name: "bad mode", files: with("driver/nvidia/capabilities/gpu0/mig/gi1/access", access("12", "0x124")), gi: 1, ci: 2, wantErr: "DeviceFileMode"},
		{name: "access file and mig-minors disagree", files: with("driver/nvidia/capabilities/gpu0/mig/gi1/access", access("13", "292")), gi: 1, ci: 2, wantErr: "mig-minors says 12"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := writeProc(t, tc.files)
			gi, ci, err := ReadMIGCapDevices(root, 0, tc.gi, tc.ci)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if gi.Path != "/dev/nvidia-caps/nvidia-cap12" || gi.Major != 238 || gi.Minor != 12 || gi.Mode != 0o444 {
				t.Errorf("GI capability %+v, want c 238:12 mode 0444", gi)
			}
			if ci.Path != "/dev/nvidia-caps/nvidia-cap15" || ci.Major != 238 || ci.Minor != 15 || ci.Mode != 0o400 {
				t.Errorf("CI capability %+v, want c 238:15 mode 0400", ci)
			}
			n := ci.DeviceNode()
			if n.Type != "c" || n.Major != 238 || n.Minor != 15 || n.HostPath != "" || n.FileMode == nil || *n.FileMode != 0o400 {
				t.Errorf("CDI device node %+v", *n)
			}
		})
	}
}
