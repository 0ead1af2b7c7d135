package nodeevents

import (
	"testing"

	"k8s.io/client-go/tools/record"
)

func TestRecorder(t *testing.T) {
	fake := record.NewFakeRecorder(4)
	r := NewWith(fake, "node-1")
	r.Normal("FacetA", "one")
	r.Warning("FacetB", "two")
	r.Stop()
	for _, want := range []string{"Normal FacetA one", "Warning FacetB two"} {
		if got := <-fake.Events; got != want {
			t.Errorf("event %q, want %q", got, want)
		}
	}
	if r.EventRecorder() != fake {
		t.Error("EventRecorder is not the recorder underneath")
	}
	if r.ref.Kind != "Node" || r.ref.Name != "node-1" || string(r.ref.UID) != "node-1" {
		t.Errorf("reference %+v, want the Node node-1 with its name as UID", r.ref)
	}
}
