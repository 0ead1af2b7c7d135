package nodeevents

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
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

func TestWarnNow(t *testing.T) {
	for _, tc := range []struct {
		name    string
		msg     string
		fail    bool // the API server refuses the Event
		wantMsg string
	}{
		{name: "message", msg: "nvidia-cdi-hook at host path /usr/bin/nvidia-cdi-hook does not exist", wantMsg: "nvidia-cdi-hook at host path /usr/bin/nvidia-cdi-hook does not exist"},
		{name: "long message", msg: strings.Repeat("x", 2000), wantMsg: strings.Repeat("x", MaxMessage-3) + "..."},
		{name: "API server refuses", msg: "m", fail: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			if tc.fail {
				client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, errors.New("forbidden")
				})
			}
			err := WarnNow(context.Background(), client.CoreV1(), "gpu-node-1", "FacetSomething", tc.msg)
			if tc.fail {
				if err == nil || !strings.Contains(err.Error(), "forbidden") || !strings.Contains(err.Error(), "gpu-node-1") || !strings.Contains(err.Error(), "FacetSomething") {
					t.Fatalf("error %v, want one naming the Node, the reason and the cause", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			list, err := client.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
			if err != nil || len(list.Items) != 1 {
				t.Fatalf("%d events, %v", len(list.Items), err)
			}
			ev := list.Items[0]
			if ev.Type != corev1.EventTypeWarning || ev.Reason != "FacetSomething" || ev.Message != tc.wantMsg ||
				ev.InvolvedObject.Kind != "Node" || ev.InvolvedObject.Name != "gpu-node-1" || string(ev.InvolvedObject.UID) != "gpu-node-1" ||
				ev.Source.Component != Component || ev.Count != 1 {
				t.Errorf("event %+v", ev)
			}
		})
	}
}
