// Package yamlstream writes Kubernetes objects as one YAML stream: each
// object marshalled by sigs.k8s.io/yaml (its JSON tags, as kubectl prints
// them), separated by "---", an optional comment above each. It is the one
// YAML stream writer of Facet: `facetctl slices`, the ResourceSlices'
// golden files and `facetctl classes` print through it.
package yamlstream

import (
	"fmt"
	"io"
	"strings"

	"sigs.k8s.io/yaml"
)

// Doc is one object of a stream.
type Doc struct {
	// Object is marshalled as YAML.
	Object any
	// Name names the object in errors (its kind and name).
	Name string
	// Comment, if any, is printed above the object, each line after "# ".
	Comment string
}

// Write prints docs to w as a YAML stream. A marshalling error names the
// document; nothing of the stream is written then.
func Write(w io.Writer, docs []Doc) error {
	var b strings.Builder
	for i, d := range docs {
		data, err := yaml.Marshal(d.Object)
		if err != nil {
			return fmt.Errorf("marshal %s: %w", d.Name, err)
		}
		if i > 0 {
			b.WriteString("---\n")
		}
		if d.Comment != "" {
			for _, l := range strings.Split(strings.TrimRight(d.Comment, "\n"), "\n") {
				b.WriteString("# " + l + "\n")
			}
		}
		// creationTimestamp: null is metav1.Time's marshalling of an
		// object never stored: noise in what a person reads.
		b.WriteString(strings.Replace(string(data), "  creationTimestamp: null\n", "", 1))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
