// Package nodeevents records Events on the plugin's Node object, where
// `kubectl describe node` shows them: what the plugin detected, what it
// fell back from, and the GPUs' health changes.
package nodeevents

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
)

// Recorder records Events on one Node. Its EventRecorder also serves
// Events on other objects (the driver's on claims and pods), through the
// same broadcaster.
type Recorder struct {
	rec  record.EventRecorder
	ref  *corev1.ObjectReference
	stop func()
}

// New starts a broadcaster to the API server's Events of client, for the
// Node named node, with the component "facet-kubeletplugin". Stop ends it.
func New(ctx context.Context, client kubernetes.Interface, node string) *Recorder {
	b := record.NewBroadcaster(record.WithContext(ctx))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	return newRecorder(b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "facet-kubeletplugin", Host: node}), node, b.Shutdown)
}

// NewWith records through rec (a record.FakeRecorder in tests); Stop does
// nothing.
func NewWith(rec record.EventRecorder, node string) *Recorder {
	return newRecorder(rec, node, func() {})
}

func newRecorder(rec record.EventRecorder, node string, stop func()) *Recorder {
	// The kubelet refers to its Node the same way: the name as UID.
	ref := &corev1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(node)}
	return &Recorder{rec: rec, ref: ref, stop: stop}
}

// Normal records a Normal Event with reason and message on the Node.
func (e *Recorder) Normal(reason, msg string) {
	e.rec.Event(e.ref, corev1.EventTypeNormal, reason, msg)
}

// Warning records a Warning Event with reason and message on the Node.
func (e *Recorder) Warning(reason, msg string) {
	e.rec.Event(e.ref, corev1.EventTypeWarning, reason, msg)
}

// EventRecorder is the recorder underneath, for Events on other objects.
func (e *Recorder) EventRecorder() record.EventRecorder { return e.rec }

// Stop shuts the broadcaster down; Events recorded after are dropped.
func (e *Recorder) Stop() { e.stop() }
