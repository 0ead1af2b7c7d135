package v1alpha1

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// FuzzDecode: the opaque config decoder never panics on what a user can
// put in a claim, and what it accepts survives a round trip: encoded
// again, it decodes to the same config, which then validates. A claim's
// config that Decode accepts must never fail later for another reason.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig"}`,
		`{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig","enforcement":"disabled","coreUtilizationPolicy":"force","taskPriority":0,"logLevel":4}`,
		`{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"GpuConfig"}`,
		`{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig","taskPriority":7}`,
		`{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig","logLevel":1,"logLevel":2}`,
		`{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"MigConfig"}`,
		`{apiVersion: gpu.facet.dev/v1alpha1, kind: VgpuConfig}`,
		`null`, `[]`, `{}`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		cfg, err := Decode(raw)
		if err != nil {
			if cfg != nil {
				t.Fatalf("error %v with a config %#v", err, cfg)
			}
			return
		}
		if cfg == nil {
			t.Fatal("no error and no config")
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("accepted config fails Validate: %v", err)
		}
		again, err := json.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		cfg2, err := Decode(again)
		if err != nil {
			t.Fatalf("re-encoded %s refused: %v", again, err)
		}
		if !reflect.DeepEqual(cfg, cfg2) {
			t.Fatalf("round trip changed the config:\n%#v\n%#v", cfg, cfg2)
		}
		// Defaulting keeps a config valid.
		cfg.Default()
		if err := cfg.Validate(); err != nil {
			t.Fatalf("defaulted config invalid: %v", errors.Unwrap(err))
		}
	})
}
