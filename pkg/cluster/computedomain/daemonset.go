package computedomain

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
)

// DaemonSetName is the IMEX DaemonSet of the domain: imex-<domain UID>, in
// Facet's namespace.
func DaemonSetName(cd *v1alpha1.ComputeDomain) string { return "imex-" + string(cd.UID) }

// LoadPodTemplate reads the IMEX daemons' pod template (the chart renders
// it into a ConfigMap the controller mounts; --imex-pod-template): a
// PodTemplateSpec in YAML, strictly decoded, with a container named
// "imex" that runs facet-imex. Everything of the pod is the chart's
// (image, security context, probes, tolerations, volumes); DaemonSet adds
// only what is the domain's.
func LoadPodTemplate(path string) (*corev1.PodTemplateSpec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--imex-pod-template: %w", err)
	}
	return ParsePodTemplate(data, path)
}

// ParsePodTemplate is LoadPodTemplate on data read from source.
func ParsePodTemplate(data []byte, source string) (*corev1.PodTemplateSpec, error) {
	var t corev1.PodTemplateSpec
	if err := yaml.UnmarshalStrict(data, &t); err != nil {
		return nil, fmt.Errorf("IMEX pod template %s: %w", source, err)
	}
	if imexContainer(&t.Spec) == nil {
		return nil, fmt.Errorf("IMEX pod template %s: no container named %q (the one that runs facet-imex)", source, Container)
	}
	if len(imexContainer(&t.Spec).Command) == 0 {
		return nil, fmt.Errorf("IMEX pod template %s: container %q has no command", source, Container)
	}
	return &t, nil
}

func imexContainer(spec *corev1.PodSpec) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == Container {
			return &spec.Containers[i]
		}
	}
	return nil
}

// DaemonSet is the domain's IMEX DaemonSet in namespace, from the chart's
// pod template: its pods land only on nodes labelled with the domain's UID
// (the kubelet plugin's label, set while a channel claim of the domain is
// prepared there), and facet-imex gets the domain's namespace, name and
// UID and its node's name (--domain-namespace, --domain-name, --domain-uid,
// --node-name) after the template's own arguments. The update strategy is
// OnDelete: a new template (a chart upgrade) reaches new pods, never a
// running daemon under a running job. The spec's hash is in
// AnnotationHash.
func DaemonSet(cd *v1alpha1.ComputeDomain, tpl *corev1.PodTemplateSpec, namespace string) (*appsv1.DaemonSet, error) {
	pod := tpl.DeepCopy()
	uid := string(cd.UID)
	pod.Labels = maps.Clone(pod.Labels)
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	pod.Labels[Label] = uid
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[AnnotationDomain] = cd.Namespace + "/" + cd.Name
	if pod.Spec.NodeSelector == nil {
		pod.Spec.NodeSelector = map[string]string{}
	}
	pod.Spec.NodeSelector[Label] = uid
	c := imexContainer(&pod.Spec)
	if c == nil {
		return nil, fmt.Errorf("IMEX pod template: no container named %q", Container)
	}
	hasNodeName := false
	for _, e := range c.Env {
		if e.Name == "NODE_NAME" {
			hasNodeName = true
		}
	}
	if !hasNodeName {
		c.Env = append(c.Env, corev1.EnvVar{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "spec.nodeName"}}})
	}
	c.Args = append(c.Args,
		"--domain-namespace="+cd.Namespace,
		"--domain-name="+cd.Name,
		"--domain-uid="+uid,
		"--node-name=$(NODE_NAME)",
	)
	labels := maps.Clone(pod.Labels)
	ds := &appsv1.DaemonSet{
		TypeMeta: metav1.TypeMeta{APIVersion: appsv1.SchemeGroupVersion.String(), Kind: "DaemonSet"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        DaemonSetName(cd),
			Namespace:   namespace,
			Labels:      labels,
			Annotations: map[string]string{AnnotationDomain: cd.Namespace + "/" + cd.Name},
		},
		Spec: appsv1.DaemonSetSpec{
			Selector:       &metav1.LabelSelector{MatchLabels: map[string]string{Label: uid}},
			Template:       *pod,
			UpdateStrategy: appsv1.DaemonSetUpdateStrategy{Type: appsv1.OnDeleteDaemonSetStrategyType},
		},
	}
	h, err := specHash(ds.Spec)
	if err != nil {
		return nil, err
	}
	ds.Annotations[AnnotationHash] = h
	return ds, nil
}

// specHash is the SHA-256 of the spec's JSON, hex, first 16 bytes.
func specHash(spec appsv1.DaemonSetSpec) (string, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16]), nil
}
