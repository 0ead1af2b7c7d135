package inventory

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/facet-gpu/facet/pkg/model/features"
)

// TestDefectsOf: what each mode meets of AllocatorDefects on each
// Kubernetes version, and whether it is refused for it ("!") or warned
// about. kubernetes#140433 (1.36 up to 1.37.0) is met by no mode: every
// Facet share records its consumedCapacity, so the allocator never charges
// a shared GPU's counters twice (test/allocator
// TestK8s140433ShareChargedTwice).
func TestDefectsOf(t *testing.T) {
	gates := []features.Gate{features.PartitionableDevices, features.ConsumableCapacity}
	for _, tc := range []struct {
		version string
		mode    Mode
		want    string
	}{
		{"v1.35.4", ModeDynamic, "[kubernetes#139034! kubernetes#140436]"},
		{"v1.35.4", ModeMIG, "[kubernetes#140436]"},
		{"v1.35.4", ModeShared, "[]"},
		{"v1.35.4", ModeExclusive, "[]"},
		{"v1.35.4", ModeStaticMIG, "[]"},
		{"v1.35.4", ModeSlots, "[]"},
		{"v1.36.0", ModeDynamic, "[kubernetes#139034! kubernetes#140436]"},
		{"v1.36.2", ModeDynamic, "[kubernetes#140436]"},
		{"v1.36.2", ModeMIG, "[kubernetes#140436]"},
		{"v1.36.3", ModeDynamic, "[]"},
		{"v1.36.3", ModeMIG, "[]"},
		// The 1.36 line keeps kubernetes#140433 (backport declined), which
		// no mode meets.
		{"v1.36.6", ModeDynamic, "[]"},
		{"v1.36.6", ModeShared, "[]"},
		{"v1.37.0", ModeDynamic, "[]"},
		// A version Facet cannot read meets every defect a mode meets.
		{"", ModeDynamic, "[kubernetes#139034! kubernetes#140436]"},
		{"not-a-version", ModeMIG, "[kubernetes#140436]"},
		{"", ModeShared, "[]"},
	} {
		t.Run(fmt.Sprintf("%s/%s", tc.version, tc.mode), func(t *testing.T) {
			got := []string{}
			for _, d := range defectsOf(tc.mode, *cluster(tc.version, gates...)) {
				mark := ""
				if d.Refuse {
					mark = "!"
				}
				got = append(got, d.Issue+mark)
			}
			if fmt.Sprint(got) != tc.want {
				t.Errorf("defects %v, want %s", got, tc.want)
			}
		})
	}
}

// TestDefectsAt: the defects whose fix a version change can cross, which
// restart the plugin. kubernetes#140433 is not among them: no mode meets
// it, so crossing 1.37.0 changes nothing the plugin publishes.
func TestDefectsAt(t *testing.T) {
	for _, tc := range []struct {
		version string
		want    string
	}{
		{"v1.35.4", "[kubernetes#139034 kubernetes#140436]"},
		{"v1.36.1", "[kubernetes#139034 kubernetes#140436]"},
		{"v1.36.2", "[kubernetes#140436]"},
		{"v1.36.3", "[]"},
		{"v1.36.6", "[]"},
		{"v1.37.0", "[]"},
		{"v1.37.2+k3s1", "[]"},
		{"", "[kubernetes#139034 kubernetes#140436]"},
	} {
		if got := fmt.Sprint(DefectsAt(tc.version)); got != tc.want {
			t.Errorf("DefectsAt(%q) = %s, want %s", tc.version, got, tc.want)
		}
	}
}

// TestAllocatorDefectsTable: each entry says enough for its error, its
// warning and the docs, and names a test in test/allocator that exists,
// so the version it is fixed in is checked (hack/allocator-matrix.sh).
func TestAllocatorDefectsTable(t *testing.T) {
	var src strings.Builder
	files, err := filepath.Glob(filepath.Join("..", "..", "..", "test", "allocator", "*_test.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("test/allocator: %d files, %v", len(files), err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src.Write(b)
	}
	issue := regexp.MustCompile(`^kubernetes#[0-9]+$`)
	seen := map[string]bool{}
	for _, d := range AllocatorDefects {
		if !issue.MatchString(d.Issue) || seen[d.Issue] {
			t.Errorf("issue %q: want kubernetes#<number>, once", d.Issue)
		}
		seen[d.Issue] = true
		if d.FixedIn == nil {
			t.Errorf("%s: fixedIn unset", d.Issue)
		}
		if d.Effect == "" {
			t.Errorf("%s: effect empty", d.Issue)
		}
		if d.Refuse && len(d.Modes) == 0 {
			t.Errorf("%s: refuse set with no modes, which refuses nothing", d.Issue)
		}
		if !strings.Contains(src.String(), "func "+d.Test+"(t *testing.T)") {
			t.Errorf("%s: test %q not found in test/allocator", d.Issue, d.Test)
		}
	}
}
