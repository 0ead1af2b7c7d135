package inventory

import (
	"reflect"
	"strings"
	"testing"
)

func TestParsePerGPUModes(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    map[int]Mode
		wantErr string
	}{
		{"", map[int]Mode{}, ""},
		{"0-2=exclusive, 5=exclusive", map[int]Mode{0: ModeExclusive, 1: ModeExclusive, 2: ModeExclusive, 5: ModeExclusive}, ""},
		{"0=turbo", nil, `unknown mode "turbo"`},
		{"0", nil, "want INDEX[-INDEX]=MODE"},
		{"3-1=exclusive", nil, "is not an index or range"},
		{"x=exclusive", nil, "is not an index or range"},
		{"0-1=exclusive,1=exclusive", nil, "GPU 1 already set"},
	} {
		got, err := ParsePerGPUModes(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: error %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: got %v %v, want %v", tc.in, got, err, tc.want)
		}
	}
}
