package v1alpha1

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
)

func TestComputeDomainChannelConfig(t *testing.T) {
	for _, tc := range []struct {
		name, raw, wantErr string
		wantMode           ChannelAllocationMode
	}{
		{name: "minimal, defaulted to Single",
			raw:      `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"ComputeDomainChannelConfig","domainUID":"0b6b7d5e-1111-4c3b-9f1e-2a2b3c4d5e6f","domainName":"train"}`,
			wantMode: ChannelAllocationSingle},
		{name: "All",
			raw:      `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"ComputeDomainChannelConfig","domainUID":"u","domainName":"train","allocationMode":"All"}`,
			wantMode: ChannelAllocationAll},
		{name: "no UID",
			raw:     `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"ComputeDomainChannelConfig","domainName":"train"}`,
			wantErr: "ComputeDomainChannelConfig: domainUID: Required value"},
		{name: "bad name",
			raw:     `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"ComputeDomainChannelConfig","domainUID":"u","domainName":"Train_1"}`,
			wantErr: `domainName: Invalid value: "Train_1"`},
		{name: "bad mode",
			raw:     `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"ComputeDomainChannelConfig","domainUID":"u","domainName":"t","allocationMode":"some"}`,
			wantErr: `allocationMode: Unsupported value: "some": supported values: "Single", "All"`},
		{name: "unknown field",
			raw:     `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"ComputeDomainChannelConfig","domainUID":"u","domainName":"t","numNodes":4}`,
			wantErr: `unknown field "numNodes"`},
		{name: "a served kind is not parameters",
			raw:     `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"ComputeDomain","spec":{"numNodes":2}}`,
			wantErr: `kind: Unsupported value: "ComputeDomain"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Decode([]byte(tc.raw))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Decode error = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c, ok := cfg.(*ComputeDomainChannelConfig)
			if !ok {
				t.Fatalf("Decode = %T, want *ComputeDomainChannelConfig", cfg)
			}
			c.Default()
			if c.AllocationMode != tc.wantMode {
				t.Errorf("allocationMode = %q, want %q", c.AllocationMode, tc.wantMode)
			}
		})
	}
}

func TestValidateComputeDomainSpec(t *testing.T) {
	good := func() ComputeDomainSpec {
		return ComputeDomainSpec{NumNodes: 4, Channel: ComputeDomainChannelSpec{
			ResourceClaimTemplate: ComputeDomainResourceClaimTemplate{Name: "train-channel"}}}
	}
	for _, tc := range []struct {
		name    string
		edit    func(*ComputeDomainSpec)
		wantErr string
	}{
		{name: "good", edit: func(*ComputeDomainSpec) {}},
		{name: "zero nodes", edit: func(s *ComputeDomainSpec) { s.NumNodes = 0 },
			wantErr: "spec.numNodes: Invalid value: 0: must be between 1 and 64"},
		{name: "too many nodes", edit: func(s *ComputeDomainSpec) { s.NumNodes = 65 },
			wantErr: "spec.numNodes: Invalid value: 65"},
		{name: "no template", edit: func(s *ComputeDomainSpec) { s.Channel.ResourceClaimTemplate.Name = "" },
			wantErr: "spec.channel.resourceClaimTemplate.name: Required value"},
		{name: "bad template name", edit: func(s *ComputeDomainSpec) { s.Channel.ResourceClaimTemplate.Name = "A b" },
			wantErr: `spec.channel.resourceClaimTemplate.name: Invalid value: "A b"`},
		{name: "bad mode", edit: func(s *ComputeDomainSpec) { s.Channel.AllocationMode = "single" },
			wantErr: `spec.channel.allocationMode: Unsupported value: "single"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := good()
			tc.edit(&s)
			err := ValidateComputeDomainSpec(&s)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error = %v, want it to contain %q", err, tc.wantErr)
			}
		})
	}
}

func TestCliqueName(t *testing.T) {
	if got, want := CliqueName("6f1a2b3c-4d5e-4f60-8a1b-2c3d4e5f6a7b", 32766), "6f1a2b3c-4d5e-4f60-8a1b-2c3d4e5f6a7b.32766"; got != want {
		t.Errorf("CliqueName = %q, want %q", got, want)
	}
}

func TestEffectiveComputeDomainChannelConfig(t *testing.T) {
	channel := func(fields string) string {
		return `{` + apiVersion + `,"kind":"ComputeDomainChannelConfig",` + fields + `}`
	}
	train := channel(`"domainUID":"4b1f","domainName":"train"`)
	for _, tc := range []struct {
		name    string
		configs []resourceapi.DeviceAllocationConfiguration
		request string
		want    *ComputeDomainChannelConfig
		wantErr string
	}{
		{name: "none applies", request: "channel"},
		{name: "the template's, defaulted", configs: []resourceapi.DeviceAllocationConfiguration{fromClaim(train, "channel")}, request: "channel",
			want: NewComputeDomainChannelConfig("train", "4b1f", "")},
		{name: "All", configs: []resourceapi.DeviceAllocationConfiguration{fromClaim(channel(`"domainUID":"4b1f","domainName":"train","allocationMode":"All"`))}, request: "channel",
			want: NewComputeDomainChannelConfig("train", "4b1f", ChannelAllocationAll)},
		{name: "for another request", configs: []resourceapi.DeviceAllocationConfiguration{fromClaim(train, "gpu")}, request: "channel"},
		{name: "a subrequest's main request", configs: []resourceapi.DeviceAllocationConfiguration{fromClaim(train, "channel")}, request: "channel/any",
			want: NewComputeDomainChannelConfig("train", "4b1f", "")},
		{name: "other kinds are not it", configs: []resourceapi.DeviceAllocationConfiguration{fromClaim(`{` + apiVersion + `,"kind":"GpuConfig"}`)}, request: "channel"},
		{name: "the same twice", configs: []resourceapi.DeviceAllocationConfiguration{fromClass(train), fromClaim(channel(`"domainUID":"4b1f","domainName":"train","allocationMode":"Single"`))}, request: "channel",
			want: NewComputeDomainChannelConfig("train", "4b1f", "")},
		{name: "two domains", configs: []resourceapi.DeviceAllocationConfiguration{fromClass(train), fromClaim(channel(`"domainUID":"77aa","domainName":"eval"`))}, request: "channel",
			wantErr: `devices.config[0] (from class) and devices.config[1] (from claim) both apply to request "channel" with different ComputeDomainChannelConfigs`},
		{name: "no UID", configs: []resourceapi.DeviceAllocationConfiguration{fromClaim(channel(`"domainName":"train"`))}, request: "channel",
			wantErr: `devices.config[0] (from claim): ComputeDomainChannelConfig: domainUID: Required value`},
		{name: "a malformed entry for another request", configs: []resourceapi.DeviceAllocationConfiguration{fromClaim(train, "channel"), fromClaim(channel(`"domainUID":"x","domainName":"Not_A_Name"`), "other")}, request: "channel",
			wantErr: `devices.config[1] (from claim): ComputeDomainChannelConfig: domainName: Invalid value: "Not_A_Name"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := EffectiveComputeDomainChannelConfig(tc.configs, tc.request)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %+v, %v; want an error with %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
