package sim

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"sigs.k8s.io/yaml"
)

// FuzzParseMachine: the machine file parser never panics, and a machine it
// accepts is stable: validating it again changes nothing, and written out
// it parses to the same machine. Small accepted machines are simulated:
// discovery works or fails with an error, never a panic.
func FuzzParseMachine(f *testing.F) {
	for _, name := range []string{"l4x4.yaml", "dgx-h100.yaml"} {
		data, err := os.ReadFile(filepath.Join("..", "..", "..", "demo", "machines", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("name: x\ndriverVersion: \"580.159.04\"\ncudaDriverVersion: \"13.0\"\ngpus:\n- model: H100-SXM5-80GB\n  pciBusID: \"0000:01:00.0\"\n"))
	f.Add([]byte("name: x\ngpus: []\n"))
	f.Add([]byte("{"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseMachine(data)
		if err != nil {
			return
		}
		again := *m
		again.GPUs = append([]MachineGPU(nil), m.GPUs...)
		if err := again.Validate(); err != nil {
			t.Fatalf("an accepted machine fails validation again: %v", err)
		}
		if !reflect.DeepEqual(&again, m) {
			t.Fatalf("validating twice changed the machine")
		}
		out, err := yaml.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := ParseMachine(out)
		if err != nil {
			t.Fatalf("an accepted machine, written out, does not parse: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(m, m2) {
			t.Fatalf("round trip changed the machine:\n%+v\n%+v", m, m2)
		}
		if len(m.GPUs) <= 2 {
			_, _ = DiscoverSimulated(m) // ignored: it must only not panic
		}
	})
}
