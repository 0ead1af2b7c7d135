package computedomain

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	resourceapi "k8s.io/api/resource/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
)

// TestDemoTwoNodes: demo/compute-domains/two-nodes.yaml (docs/workloads.md's
// example) decodes strictly, its domain is valid, and every pod of the Job
// names the domain's channel template and claims it in its container.
func TestDemoTwoNodes(t *testing.T) {
	data, err := os.ReadFile("../../../demo/compute-domains/two-nodes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cd *v1alpha1.ComputeDomain
	var job *batchv1.Job
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var kind struct{ Kind string }
		if err := yaml.Unmarshal(doc, &kind); err != nil {
			t.Fatal(err)
		}
		switch kind.Kind {
		case "ComputeDomain":
			cd = &v1alpha1.ComputeDomain{}
			err = yaml.UnmarshalStrict(doc, cd)
		case "Job":
			job = &batchv1.Job{}
			err = yaml.UnmarshalStrict(doc, job)
		case "ResourceClaimTemplate":
			err = yaml.UnmarshalStrict(doc, &resourceapi.ResourceClaimTemplate{})
		default:
			t.Fatalf("unexpected kind %q", kind.Kind)
		}
		if err != nil {
			t.Fatalf("%s: %v", kind.Kind, err)
		}
	}
	if cd == nil || job == nil {
		t.Fatal("the demo has no ComputeDomain or no Job")
	}
	if err := v1alpha1.ValidateComputeDomainSpec(&cd.Spec); err != nil {
		t.Fatal(err)
	}
	pod := job.Spec.Template.Spec
	if *job.Spec.Parallelism != cd.Spec.NumNodes {
		t.Errorf("parallelism %d, numNodes %d: one pod per node", *job.Spec.Parallelism, cd.Spec.NumNodes)
	}
	named, claimed := false, false
	for _, rc := range pod.ResourceClaims {
		if rc.ResourceClaimTemplateName != nil && *rc.ResourceClaimTemplateName == cd.Spec.Channel.ResourceClaimTemplate.Name {
			named = true
			for _, c := range pod.Containers[0].Resources.Claims {
				claimed = claimed || c.Name == rc.Name
			}
		}
	}
	if !named || !claimed {
		t.Errorf("the Job's pods name the channel template: %t, claim it in the container: %t", named, claimed)
	}
}
