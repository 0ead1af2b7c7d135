package classes

import (
	"fmt"
	"io"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"
)

// WriteYAML prints r as a YAML stream for `kubectl apply -f -`: a comment
// with the notes, then the classes separated by "---", each with the
// apiVersion and kind the API server needs.
func WriteYAML(w io.Writer, r Result) error {
	var b strings.Builder
	b.WriteString("# DeviceClasses for quota by class (facetctl classes; docs/kueue.md).\n")
	for _, n := range r.Notes {
		b.WriteString("# Note: " + n + "\n")
	}
	for i, c := range r.Classes {
		c := c.DeepCopy()
		c.APIVersion, c.Kind = resourceapi.SchemeGroupVersion.String(), "DeviceClass"
		data, err := yaml.Marshal(c)
		if err != nil {
			return fmt.Errorf("DeviceClass %s: %w", c.Name, err)
		}
		if i > 0 {
			b.WriteString("---\n")
		}
		// creationTimestamp: null is noise from metav1.Time's marshalling.
		b.WriteString(strings.Replace(string(data), "  creationTimestamp: null\n", "", 1))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
