package classes

import (
	"io"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/facet-gpu/facet/pkg/model/yamlstream"
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
	docs := make([]yamlstream.Doc, 0, len(r.Classes))
	for _, c := range r.Classes {
		c := c.DeepCopy()
		c.APIVersion, c.Kind = resourceapi.SchemeGroupVersion.String(), "DeviceClass"
		docs = append(docs, yamlstream.Doc{Object: c, Name: "DeviceClass " + c.Name})
	}
	if err := yamlstream.Write(&b, docs); err != nil {
		return err
	}
	_, err := io.WriteString(w, b.String())
	return err
}
