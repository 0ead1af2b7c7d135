package nodeplugin

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

func TestExeMappings(t *testing.T) {
	maps := `00400000-01a00000 r-xp 00000000 fd:00 123 /usr/bin/facet kubeletplugin
01a00000-02c00000 r--p 01600000 fd:00 123 /usr/bin/facet kubeletplugin
02c00000-02d00000 rw-p 02800000 fd:00 123 /usr/bin/facet kubeletplugin
02d00000-02e00000 rw-p 00000000 00:00 0
7f0000000000-7f0000100000 r-xp 00000000 fd:00 456 /usr/lib/libc.so.6
7f0000200000-7f0000300000 r--s 00000000 fd:00 123 /usr/bin/facet kubeletplugin
`
	got, err := exeMappings(strings.NewReader(maps), "/usr/bin/facet kubeletplugin")
	if err != nil {
		t.Fatal(err)
	}
	want := [][2]uintptr{{0x400000, 0x1a00000}, {0x1a00000, 0x2c00000}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %x, want %x", got, want)
	}
	if _, err := exeMappings(strings.NewReader("zz-1 r-xp 0 0:0 1 /x\n"), "/x"); err == nil {
		t.Fatal("a bad address was accepted")
	}
}

// TestReleaseStartupPages: this test binary's own code pages leave its RSS.
func TestReleaseStartupPages(t *testing.T) {
	rss := func() int {
		data, err := os.ReadFile("/proc/self/status")
		if err != nil {
			t.Skip(err)
		}
		m := regexp.MustCompile(`RssFile:\s+(\d+) kB`).FindSubmatch(data)
		if m == nil {
			t.Skip("no RssFile in /proc/self/status")
		}
		n, _ := strconv.Atoi(string(m[1]))
		return n
	}
	before := rss()
	n, err := releaseStartupPages()
	if err != nil {
		t.Skipf("MADV_PAGEOUT unsupported here: %v", err)
	}
	after := rss()
	if n == 0 || after >= before {
		t.Fatalf("advised %d bytes; file-backed RSS %d kB before, %d kB after", n, before, after)
	}
	t.Logf("file-backed RSS %d kB -> %d kB", before, after)
}
