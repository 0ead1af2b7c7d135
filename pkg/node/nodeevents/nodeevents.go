// Package nodeevents records Events on the plugin's Node object, where
// `kubectl describe node` shows them: what the plugin detected, what it
// fell back from, and the GPUs' health changes.
package nodeevents

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	return newRecorder(b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: Component, Host: node}), node, b.Shutdown)
}

// NewWith records through rec (a record.FakeRecorder in tests); Stop does
// nothing.
func NewWith(rec record.EventRecorder, node string) *Recorder {
	return newRecorder(rec, node, func() {})
}

func newRecorder(rec record.EventRecorder, node string, stop func()) *Recorder {
	return &Recorder{rec: rec, ref: nodeRef(node), stop: stop}
}

// nodeRef refers to the Node as the kubelet does: the name as UID.
func nodeRef(node string) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(node)}
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

// Component is the Events' source component.
const Component = "facet-kubeletplugin"

// MaxMessage is the longest Event message the API server's events.k8s.io
// API keeps (its note); WarnNow cuts longer ones to it.
const MaxMessage = 1024

// WarnNow records a Warning Event with reason and msg on the Node named
// node, as a Recorder's Warning does, but at once and without a
// broadcaster: it waits for the API server to hold it (at most 10
// seconds), for a plugin that refuses to start and exits next, where a
// broadcaster's queue would be dropped with it.
func WarnNow(ctx context.Context, events typedcorev1.EventsGetter, node, reason, msg string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if len(msg) > MaxMessage {
		msg = msg[:MaxMessage-3] + "..."
	}
	now := metav1.Now()
	ev := &corev1.Event{
		// The recorder's names: the object's, then a unique suffix.
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", node, now.UnixNano()), Namespace: metav1.NamespaceDefault},
		InvolvedObject: *nodeRef(node),
		Reason:         reason,
		Message:        msg,
		Source:         corev1.EventSource{Component: Component, Host: node},
		FirstTimestamp: now,
		LastTimestamp:  now,
		Count:          1,
		Type:           corev1.EventTypeWarning,
	}
	if _, err := events.Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("record Event %s on Node %s: %w", reason, node, err)
	}
	return nil
}
