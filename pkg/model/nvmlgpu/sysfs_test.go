package nvmlgpu

import (
	"strings"
	"testing"
	"testing/fstest"
)

func TestSysfsNUMANode(t *testing.T) {
	const bus = "0000:18:00.0"
	file := "bus/pci/devices/" + bus + "/numa_node"
	for _, tc := range []struct {
		name    string
		fsys    fstest.MapFS
		want    int
		wantErr string
	}{
		{"node 0", fstest.MapFS{file: {Data: []byte("0\n")}}, 0, ""},
		{"node 3, no newline", fstest.MapFS{file: {Data: []byte("3")}}, 3, ""},
		{"-1: no affinity (a VM)", fstest.MapFS{file: {Data: []byte("-1\n")}}, -1, ""},
		{"no numa_node file (no CONFIG_NUMA)", fstest.MapFS{"bus/pci/devices/" + bus + "/vendor": {Data: []byte("0x10de\n")}}, -1, ""},
		{"device not in sysfs", fstest.MapFS{"bus/pci/devices/0000:19:00.0/numa_node": {Data: []byte("0\n")}}, -1, "PCI device 0000:18:00.0 is not in sysfs"},
		{"not a number", fstest.MapFS{file: {Data: []byte("zero\n")}}, -1, `numa_node: "zero" is not a NUMA node`},
		{"beyond MAX_NUMNODES", fstest.MapFS{file: {Data: []byte("1024\n")}}, -1, "NUMA node 1024 is beyond the kernel's limit of 1023"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Sysfs{FS: tc.fsys}.NUMANode(bus)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %d, %v; want an error containing %q", got, err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %d, want %d", got, tc.want)
			}
		})
	}
}

func TestPCIeSwitchFromPath(t *testing.T) {
	for _, tc := range []struct {
		name, path, want string
	}{
		{"under one switch", "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0", "0000:16:00.0"},
		{"under two switches: the nearest", "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0/0000:19:04.0/0000:1b:00.0", "0000:18:00.0"},
		{"on a root port", "/sys/devices/pci0000:15/0000:15:01.0/0000:17:00.0", ""},
		{"on the root bus (a VM)", "/sys/devices/pci0000:00/0000:00:05.0", ""},
		{"one bridge, no switch", "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0", ""},
		{"relative link target", "../../../devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0", "0000:16:00.0"},
		{"no root complex", "/sys/devices/platform/foo", ""},
		{"not a PCI chain", "/sys/devices/pci0000:15/0000:15:01.0/usb1/0000:18:00.0/0000:19:00.0", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PCIeSwitchFromPath(tc.path); got != tc.want {
				t.Errorf("PCIeSwitchFromPath(%s) = %q, want %q", tc.path, got, tc.want)
			}
		})
	}
}
