package helm

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// copies are the chart's verbatim copies of files maintained elsewhere in
// the repository: the chart cannot read outside its directory.
var copies = []struct{ source, copy string }{
	{"deployments/deviceclasses.yaml", "deployments/helm/facet/files/deviceclasses.yaml"},
	{"deployments/admission/policies.yaml", "deployments/helm/facet/files/admission-policies.yaml"},
}

func TestChartCopiesAreIdentical(t *testing.T) {
	for _, c := range copies {
		src, err := os.ReadFile(filepath.Join(repoRoot, c.source))
		if err != nil {
			t.Fatal(err)
		}
		cp, err := os.ReadFile(filepath.Join(repoRoot, c.copy))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(src, cp) {
			t.Errorf("%s differs from %s; update the chart's copy:\n  cp %s %s", c.copy, c.source, c.source, c.copy)
		}
	}
}

func parseFile(t testing.TB, rel string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, rel))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := splitYAML(string(data))
	if err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	return objs
}

// TestRenderedObjectsEqualTheirSources checks that the chart installs
// exactly the DeviceClasses of deployments/deviceclasses.yaml and the
// policies of deployments/admission/policies.yaml: same objects, same
// content, nothing added by templating.
func TestRenderedObjectsEqualTheirSources(t *testing.T) {
	objs := render(t, values(t, ""))
	for _, tc := range []struct {
		source string
		kinds  []string
	}{
		{"deployments/deviceclasses.yaml", []string{"DeviceClass"}},
		{"deployments/admission/policies.yaml", []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}},
	} {
		want := parseFile(t, tc.source)
		if len(want) == 0 {
			t.Fatalf("%s has no objects", tc.source)
		}
		rendered := map[string]*unstructured.Unstructured{}
		for _, o := range objs {
			for _, k := range tc.kinds {
				if o.GetKind() == k {
					rendered[k+"/"+o.GetName()] = o.Unstructured
				}
			}
		}
		for _, w := range want {
			id := w.GetKind() + "/" + w.GetName()
			got, ok := rendered[id]
			if !ok {
				t.Errorf("%s from %s is not rendered", id, tc.source)
				continue
			}
			if !reflect.DeepEqual(got.Object, w.Object) {
				t.Errorf("rendered %s differs from %s:\n got %v\nwant %v", id, tc.source, got.Object, w.Object)
			}
			delete(rendered, id)
		}
		if tc.kinds[0] == "DeviceClass" {
			for id := range rendered {
				t.Errorf("rendered %s is not in %s", id, tc.source)
			}
		}
	}

	off := render(t, values(t, "deviceClasses: {enabled: false}\nadmission: {policies: {enabled: false}}\n"))
	if n := len(ofKind(off, "DeviceClass")); n != 0 {
		t.Errorf("%d DeviceClasses with deviceClasses.enabled=false", n)
	}
	for _, o := range ofKind(off, "ValidatingAdmissionPolicy") {
		if o.GetName() != releaseName+"-resourceslices-own-node" && o.GetName() != releaseName+"-claim-status-own-node" && o.GetName() != releaseName+"-node-label-own-node" {
			t.Errorf("policy %s with admission.policies.enabled=false", o.GetName())
		}
	}
}

// TestClaimPoliciesDifferOnlyInTheirPath: the claim and the template
// policies must apply the same rules; only the kind they match and the path
// to the requests differ.
func TestClaimPoliciesDifferOnlyInTheirPath(t *testing.T) {
	byName := map[string]*unstructured.Unstructured{}
	for _, o := range parseFile(t, "deployments/admission/policies.yaml") {
		if o.GetKind() == "ValidatingAdmissionPolicy" {
			byName[o.GetName()] = o
		}
	}
	claim, tmpl := byName["resourceclaims.gpu.facet.dev"], byName["resourceclaimtemplates.gpu.facet.dev"]
	if claim == nil || tmpl == nil {
		t.Fatalf("policies %v", byName)
	}
	norm := func(u *unstructured.Unstructured) map[string]any {
		spec := u.DeepCopy().Object["spec"].(map[string]any)
		delete(spec, "matchConstraints")
		vars := spec["variables"].([]any)
		if vars[0].(map[string]any)["name"] != "requests" {
			t.Fatalf("%s: the first variable is not requests", u.GetName())
		}
		spec["variables"] = vars[1:]
		return spec
	}
	if !reflect.DeepEqual(norm(claim), norm(tmpl)) {
		t.Error("the ResourceClaim and ResourceClaimTemplate policies differ in more than the path to the requests; keep them in step")
	}
}
