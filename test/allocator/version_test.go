package allocator

import (
	"os/exec"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/util/version"
)

var (
	allocatorVersionOnce sync.Once
	allocatorVersionV    *version.Version
	allocatorVersionErr  error
)

// allocatorVersion is the k8s.io/dynamic-resource-allocation this test
// binary links, as the go command resolves it: go.mod's v0.35, or the
// v0.36 or v0.37 of hack/allocator-matrix.sh, which passes its go.mod
// through GOFLAGS=-modfile=..., which this inherits. (Test binaries carry
// no module versions in their build info.)
func allocatorVersion(t testing.TB) *version.Version {
	t.Helper()
	allocatorVersionOnce.Do(func() {
		out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "k8s.io/dynamic-resource-allocation").Output()
		if err != nil {
			allocatorVersionErr = err
			return
		}
		allocatorVersionV, allocatorVersionErr = version.ParseSemantic(strings.TrimSpace(string(out)))
	})
	if allocatorVersionErr != nil {
		t.Fatalf("which k8s.io/dynamic-resource-allocation: %v", allocatorVersionErr)
	}
	return allocatorVersionV
}

// fixedIn reports whether the allocator under test has the fix released
// in v (e.g. "v0.36.2" for Kubernetes 1.36.2): the bug tests expect the
// bug before it and the correct result from it on.
func fixedIn(t testing.TB, v string) bool {
	t.Helper()
	return allocatorVersion(t).AtLeast(version.MustParseSemantic(v))
}

func TestAllocatorVersion(t *testing.T) {
	v := allocatorVersion(t)
	t.Logf("allocator: k8s.io/dynamic-resource-allocation %s", v)
	if v.Major() != 0 || v.Minor() < 35 {
		t.Errorf("unexpected allocator version %s", v)
	}
}
