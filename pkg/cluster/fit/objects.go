package fit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Stream is what a YAML stream of manifests holds, by kind. Other kinds are
// skipped.
type Stream struct {
	Slices    []*resourceapi.ResourceSlice
	Classes   []*resourceapi.DeviceClass
	Claims    []*resourceapi.ResourceClaim
	Templates []*resourceapi.ResourceClaimTemplate
	Pods      []*v1.Pod
}

// Decode reads a YAML stream (as facetctl prints it or a manifest file
// holds it) strictly: an unknown field is an error naming the object.
func Decode(r io.Reader) (*Stream, error) {
	s := &Stream{}
	dec := utilyaml.NewYAMLReader(bufio.NewReader(r))
	for {
		doc, err := dec.Read()
		if errors.Is(err, io.EOF) {
			return s, nil
		}
		if err != nil {
			return nil, err
		}
		var meta struct {
			metav1.TypeMeta `json:",inline"`
			Metadata        struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return nil, err
		}
		switch meta.Kind {
		case "ResourceSlice":
			_, err = appendStrict(doc, &s.Slices)
		case "DeviceClass":
			_, err = appendStrict(doc, &s.Classes)
		case "ResourceClaim":
			var o *resourceapi.ResourceClaim
			if o, err = appendStrict(doc, &s.Claims); o.UID == "" {
				o.UID = types.UID("uid-" + o.Name)
			}
		case "ResourceClaimTemplate":
			_, err = appendStrict(doc, &s.Templates)
		case "Pod":
			_, err = appendStrict(doc, &s.Pods)
		}
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", meta.Kind, meta.Metadata.Name, err)
		}
	}
}

// appendStrict decodes doc strictly as a T and appends it to list: one
// body for every kind Decode reads. On an error Decode drops the stream,
// so what was appended does not matter.
func appendStrict[T any](doc []byte, list *[]*T) (*T, error) {
	o := new(T)
	err := yaml.UnmarshalStrict(doc, o)
	*list = append(*list, o)
	return o, err
}

// FromTemplate is the claim the resourceclaim controller would create from
// a template (for a pod, named after the pod and its claim entry).
func FromTemplate(t *resourceapi.ResourceClaimTemplate, name string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: t.Namespace, UID: types.UID("uid-" + name)},
		Spec:       t.Spec.Spec,
	}
}

// PodClaims are the claims a pod would be scheduled with: one per entry of
// spec.resourceClaims, made from its template (found in the stream) or
// named (found in the stream, else listed in missing for the caller to
// read from the cluster).
func (s *Stream) PodClaims(pod *v1.Pod) (claims []*resourceapi.ResourceClaim, missing []string, err error) {
	return s.PodClaimsWith(pod, nil)
}

// TemplateSource reads a ResourceClaimTemplate that is not in the stream
// (the cluster's, for facetctl: a ComputeDomain's channel template is the
// controller's, not the user's file).
type TemplateSource func(namespace, name string) (*resourceapi.ResourceClaimTemplate, error)

// PodClaimsWith is PodClaims, with templates that are not in the stream
// read from more (nil: none; an error names the claim entry).
func (s *Stream) PodClaimsWith(pod *v1.Pod, more TemplateSource) (claims []*resourceapi.ResourceClaim, missing []string, err error) {
	for _, pc := range pod.Spec.ResourceClaims {
		switch {
		case pc.ResourceClaimTemplateName != nil:
			t := s.template(pod.Namespace, *pc.ResourceClaimTemplateName)
			if t == nil && more != nil {
				if t, err = more(pod.Namespace, *pc.ResourceClaimTemplateName); err != nil {
					return nil, nil, fmt.Errorf("pod %s: claim %s: %w", pod.Name, pc.Name, err)
				}
			}
			if t == nil {
				return nil, nil, fmt.Errorf("pod %s: claim %s: ResourceClaimTemplate %s is not in the file", pod.Name, pc.Name, *pc.ResourceClaimTemplateName)
			}
			c := FromTemplate(t, pod.Name+"-"+pc.Name)
			c.Namespace = pod.Namespace
			claims = append(claims, c)
		case pc.ResourceClaimName != nil:
			if c := s.claim(pod.Namespace, *pc.ResourceClaimName); c != nil {
				claims = append(claims, c)
			} else {
				missing = append(missing, *pc.ResourceClaimName)
			}
		default:
			return nil, nil, fmt.Errorf("pod %s: claim %s names neither a claim nor a template", pod.Name, pc.Name)
		}
	}
	return claims, missing, nil
}

// sameNamespace treats an empty namespace (a manifest without one) as any.
func sameNamespace(a, b string) bool { return a == "" || b == "" || a == b }

func (s *Stream) template(ns, name string) *resourceapi.ResourceClaimTemplate {
	for _, t := range s.Templates {
		if t.Name == name && sameNamespace(t.Namespace, ns) {
			return t
		}
	}
	return nil
}

func (s *Stream) claim(ns, name string) *resourceapi.ResourceClaim {
	for _, c := range s.Claims {
		if c.Name == name && sameNamespace(c.Namespace, ns) {
			return c
		}
	}
	return nil
}

// ReadObjects decodes a YAML stream into ResourceSlices, DeviceClasses and
// ResourceClaims; a ResourceClaimTemplate becomes the claim the
// resourceclaim controller would create from it. Pods are skipped.
func ReadObjects(r io.Reader) (slices []*resourceapi.ResourceSlice, classes []*resourceapi.DeviceClass, claims []*resourceapi.ResourceClaim, err error) {
	s, err := Decode(r)
	if err != nil {
		return nil, nil, nil, err
	}
	claims = s.Claims
	for _, t := range s.Templates {
		claims = append(claims, FromTemplate(t, t.Name))
	}
	return s.Slices, s.Classes, claims, nil
}

// ReadFile is ReadObjects on a file.
func ReadFile(path string) ([]*resourceapi.ResourceSlice, []*resourceapi.DeviceClass, []*resourceapi.ResourceClaim, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, nil, err
	}
	return ReadObjects(bytes.NewReader(data))
}
