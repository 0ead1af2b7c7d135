package computedomain

import (
	"os"
	"strings"
	"testing"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/cluster/occupancy"
)

// TestTemplate: the channel template of a domain pinned to a clique, as
// the controller creates it (golden), and what SameTemplate tells apart.
func TestTemplate(t *testing.T) {
	cd := domain("train", 4)
	cd.Spec.Channel.AllocationMode = v1alpha1.ChannelAllocationAll
	q := clique(3, 18, 18)
	tpl, err := Template(cd, q)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "template.yaml", tpl)

	// The claims made from it are the domain's.
	if cfg := ChannelConfigOf(claimFrom(tpl)); cfg == nil || cfg.DomainUID != "uid-train" || cfg.AllocationMode != v1alpha1.ChannelAllocationAll {
		t.Errorf("config of the template's claims: %+v", cfg)
	}
	other, _ := Template(cd, clique(4, 18, 18))
	single := domain("train", 4)
	same, _ := Template(single, q)
	for _, tc := range []struct {
		name string
		have bool
	}{
		{"itself", SameTemplate(tpl, tpl)},
		{"another clique", !SameTemplate(tpl, other)},
		{"another allocation mode", !SameTemplate(tpl, same)},
	} {
		if !tc.have {
			t.Errorf("SameTemplate: %s", tc.name)
		}
	}
}

// TestCliqueSelector: the CEL names the published attributes, the UUID
// quoted and the clique ID an integer.
func TestCliqueSelector(t *testing.T) {
	got := CliqueSelector(occupancy.Clique{ClusterUUID: `a"b`, CliqueID: 7})
	want := `device.attributes["gpu.facet.dev"].fabricClusterUUID == "a\"b" && device.attributes["gpu.facet.dev"].fabricCliqueID == 7`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// TestDaemonSet: the domain's DaemonSet from the chart's pod template
// (golden): nodeSelector on the domain's label, the domain's arguments
// after the template's, OnDelete, the spec's hash; the template itself is
// left as it was.
func TestDaemonSet(t *testing.T) {
	tpl, err := LoadPodTemplate("testdata/imex-pod-template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	before := tpl.DeepCopy()
	cd := domain("train", 4)
	ds, err := DaemonSet(cd, tpl, "facet-system")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "daemonset.yaml", ds)
	if !equalYAML(t, before, tpl) {
		t.Error("DaemonSet changed the pod template it was given")
	}
	again, _ := DaemonSet(cd, tpl, "facet-system")
	if again.Annotations[AnnotationHash] != ds.Annotations[AnnotationHash] {
		t.Error("the hash of one spec differs between two calls")
	}
	tpl.Spec.Containers[0].Image = "facet.local/facet:0.2.0"
	upgraded, _ := DaemonSet(cd, tpl, "facet-system")
	if upgraded.Annotations[AnnotationHash] == ds.Annotations[AnnotationHash] {
		t.Error("a new image must change the hash, so that the controller updates the DaemonSet")
	}
}

// TestParsePodTemplate: a template the controller cannot use is refused
// at start, naming what is wrong.
func TestParsePodTemplate(t *testing.T) {
	good, err := os.ReadFile("testdata/imex-pod-template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, yaml, err string
	}{
		{"good", string(good), ""},
		{"no imex container", "spec: {containers: [{name: other, command: [x]}]}", `no container named "imex"`},
		{"no command", "spec: {containers: [{name: imex}]}", `container "imex" has no command`},
		{"unknown field", "spec: {containers: [{name: imex, command: [x], bogus: 1}]}", `unknown field`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParsePodTemplate([]byte(tc.yaml), "t.yaml")
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("error %v, want %q", err, tc.err)
			}
		})
	}
	if _, err := LoadPodTemplate("testdata/absent.yaml"); err == nil || !strings.Contains(err.Error(), "--imex-pod-template") {
		t.Errorf("absent file: %v", err)
	}
}
