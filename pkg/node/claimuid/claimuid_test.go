package claimuid

import (
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		uid types.UID
		ok  bool
	}{
		{"4f6c8a0e-2b1d-4e0a-9c3f-0123456789ab", true},
		{"uid-pair", true},
		{"a", true},
		{"a.b_c-d", true},
		{"", false},
		{"..", false},
		{"a..b", false},
		{"../etc", false},
		{"a/b", false},
		{"/abs", false},
		{"-lead", false},
		{"trail.", false},
		{"sp ace", false},
		{"nul\x00", false},
		{"ünï", false},
		{types.UID(strings.Repeat("a", MaxLen)), true},
		{types.UID(strings.Repeat("a", MaxLen+1)), false},
	} {
		err := Validate(tc.uid)
		if (err == nil) != tc.ok {
			t.Errorf("Validate(%q) = %v, want ok=%v", tc.uid, err, tc.ok)
		}
	}
}

func FuzzValidate(f *testing.F) {
	for _, s := range []string{"uid-a", "..", "a/b", "4f6c8a0e-2b1d-4e0a-9c3f-0123456789ab"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if Validate(types.UID(s)) != nil {
			return
		}
		// An accepted UID is one path element that stays inside its dir.
		if p := filepath.Join("/base", s); filepath.Dir(p) != "/base" || filepath.Base(p) != s {
			t.Fatalf("accepted %q escapes: %s", s, p)
		}
	})
}
