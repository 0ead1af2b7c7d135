package inventory

import (
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

func TestParsePerGPUModes(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    map[int]Mode
		wantErr string
	}{
		{"", map[int]Mode{}, ""},
		{"0-2=exclusive, 5=exclusive", map[int]Mode{0: ModeExclusive, 1: ModeExclusive, 2: ModeExclusive, 5: ModeExclusive}, ""},
		{"0-1=mig,2=dynamic,3=shared,4=auto", map[int]Mode{0: ModeMIG, 1: ModeMIG, 2: ModeDynamic, 3: ModeShared, 4: ModeAuto}, ""},
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

func TestModeFlags(t *testing.T) {
	for _, tc := range []struct {
		f       ModeFlags
		want    Config
		wantErr string
	}{
		{ModeFlags{}, Config{DefaultMode: ModeAuto, PerGPU: map[int]Mode{}, Order: OrderBinpack, PerGPUSlots: map[int]SlotLayout{}}, ""},
		{ModeFlags{Default: "dynamic", PerGPU: "0-1=mig,2=shared", Order: "spread"},
			Config{DefaultMode: ModeDynamic, PerGPU: map[int]Mode{0: ModeMIG, 1: ModeMIG, 2: ModeShared}, Order: OrderSpread, PerGPUSlots: map[int]SlotLayout{}}, ""},
		{ModeFlags{Default: "slots", Slots: "2", PerGPUSlots: "1=1x8Gi/50"},
			Config{DefaultMode: ModeSlots, PerGPU: map[int]Mode{}, Order: OrderBinpack, DefaultSlots: SlotLayout{{Count: 2}},
				PerGPUSlots: map[int]SlotLayout{1: {{Count: 1, Memory: resource.MustParse("8Gi"), Cores: 50}}}}, ""},
		{ModeFlags{Slots: "0"}, Config{}, "--slots"},
		{ModeFlags{PerGPUSlots: "0=4x20Gi"}, Config{}, "--gpu-slots"},
		{ModeFlags{Default: "turbo"}, Config{}, "--mode"},
		{ModeFlags{PerGPU: "0=x"}, Config{}, "--gpu-modes"},
		{ModeFlags{Order: "random"}, Config{}, "--gpu-order"},
	} {
		got, err := tc.f.Config()
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%+v: error %v, want %q", tc.f, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%+v: got %+v %v, want %+v", tc.f, got, err, tc.want)
		}
	}
}
