package slices

import (
	"fmt"
	"io"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"
)

// WriteYAML prints slices as a YAML stream separated by "---".
func WriteYAML(w io.Writer, objs []*resourceapi.ResourceSlice) error {
	for i, o := range objs {
		data, err := yaml.Marshal(o)
		if err != nil {
			return fmt.Errorf("marshal ResourceSlice %s: %w", o.Name, err)
		}
		if i > 0 {
			if _, err := io.WriteString(w, "---\n"); err != nil {
				return err
			}
		}
		if _, err := w.Write(data); err != nil {
			return err
		}
	}
	return nil
}
