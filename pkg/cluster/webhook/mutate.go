package webhook

// The pod mutator replaces extended resources with DRA claims where the
// scheduler cannot serve them from a DeviceClass, so that pods written for
// NVIDIA's device plugin, HAMi or Volcano still run: every mapped resource
// on clusters where the API server drops a DeviceClass's
// extendedResourceName (the DRAExtendedResource gate is off, as on stock
// Kubernetes 1.35), and on clusters where it keeps the field (1.36 and
// later), the resources no class maps: HAMi's and Volcano's vGPU sizes,
// since a class's mapping carries a count of devices, not a size.
//
// For each container asking for a mapped resource it removes the resource
// from limits and requests, adds a pod resourceClaims entry that names a
// ResourceClaimTemplate, and lists that entry in the container's
// resources.claims. The resourceclaim controller then makes one claim per
// pod from the template, owned by the pod, so it is deleted with the pod.
// The templates are shared by every pod of a shape in a namespace; the
// webhook creates them when missing.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	configapi "github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/model/names"
)

// MutatePath is where the pod mutator is served.
const MutatePath = "/mutate-pods"

const (
	// ManagedByLabel marks the templates the webhook creates, and the
	// claims made from them.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "facet-webhook"
	// RewrittenAnnotation records on a mutated pod what was replaced by
	// which claim, since the original limits are gone from its spec.
	RewrittenAnnotation = "gpu.facet.dev/extended-resources"
	// claimPrefix starts the names of the pod's resourceClaims entries
	// that the webhook adds.
	claimPrefix = "facet-"
	// templateRequest is the name of the one request in each template.
	templateRequest = "devices"
)

// RewriteMode says when the mutator rewrites pods (not a GPU's mode,
// inventory.Mode).
type RewriteMode string

const (
	// RewriteAuto decides per resource: an extended resource that some
	// DeviceClass names in spec.extendedResourceName, which the API server
	// keeps only where the DRAExtendedResource gate is on, is left to the
	// scheduler, which serves it from the class; the rest is rewritten. A
	// vGPU shape (HAMi's nvidia.com/gpu with nvidia.com/gpumem, Volcano's
	// volcano.sh/vgpu-*) is rewritten whole unless every resource of it is
	// mapped. With the gate off no class keeps the field, so every mapped
	// resource is rewritten.
	RewriteAuto RewriteMode = "auto"
	// RewriteAlways rewrites pods whatever the gate, e.g. where the API
	// server's gate is on but the scheduler's is off.
	RewriteAlways RewriteMode = "always"
	// RewriteNever leaves every pod alone.
	RewriteNever RewriteMode = "never"
)

// ParseRewriteMode parses --mutate-extended-resources.
func ParseRewriteMode(s string) (RewriteMode, error) {
	return names.Parse(s, "mode", RewriteAuto, RewriteAlways, RewriteNever)
}

// MutatorOptions configures NewMutator.
type MutatorOptions struct {
	Map         ExtendedResourceMap
	RewriteMode RewriteMode
	// Classes lists the cluster's DeviceClasses, from an informer: the
	// extendedResourceNames they keep decide ModeAuto, and a claim is made
	// only for a class that exists.
	Classes resourcelisters.DeviceClassLister
	// Client creates the ResourceClaimTemplates.
	Client kubernetes.Interface
	// Kueue writes templates Kueue can count (kueue.go); default off.
	Kueue KueueMode
	// PreferExistingMIG writes a MIG claim as a prioritized list
	// (firstAvailable, DRAPrioritizedList: on by default from Kubernetes
	// 1.34): an instance that exists (static-mig), then a carve on a GPU
	// already in MIG use (migInUse), then any carve
	// (demo/mig/prefer-existing.yaml). Not while Kueue mode is on: Kueue
	// counts a claim's `exactly` requests by DeviceClass; and not while
	// PrioritizedList says the API server drops firstAvailable.
	PreferExistingMIG bool
	// PrioritizedList says whether the API server keeps firstAvailable
	// (a PrioritizedListProbe); required with PreferExistingMIG.
	PrioritizedList PrioritizedListSupport
}

// Mutator is the HTTP handler of MutatePath.
type Mutator struct {
	logger klog.Logger
	opts   MutatorOptions

	mu   sync.Mutex
	last string // the decision last logged

	kueueState *kueueDetector
}

// NewMutator checks the table and returns the handler.
func NewMutator(logger klog.Logger, opts MutatorOptions) (*Mutator, error) {
	if err := opts.Map.Validate(); err != nil {
		return nil, fmt.Errorf("extended resource map: %w", err)
	}
	if opts.RewriteMode == "" {
		opts.RewriteMode = RewriteAuto
	}
	if _, err := ParseRewriteMode(string(opts.RewriteMode)); err != nil {
		return nil, fmt.Errorf("mode: %w", err)
	}
	var err error
	if opts.Kueue, err = kueueOption(opts.Kueue); err != nil {
		return nil, err
	}
	if opts.Classes == nil || opts.Client == nil {
		return nil, errors.New("the pod mutator needs a DeviceClass lister and an API client")
	}
	if opts.PreferExistingMIG && opts.PrioritizedList == nil {
		return nil, errors.New("PreferExistingMIG needs PrioritizedList, to tell whether the API server keeps firstAvailable")
	}
	return &Mutator{logger: logger, opts: opts, kueueState: &kueueDetector{
		discovery: opts.Client.Discovery(), logger: logger,
		consequence: "--kueue=auto: while served, pods are written for Kueue",
	}}, nil
}

// Run re-decides every interval until ctx is done, so that a change (the
// gate turned on, Facet's classes installed) is logged when it happens and
// not only at the next pod.
func (m *Mutator) Run(ctx context.Context, interval time.Duration) {
	wait.UntilWithContext(ctx, func(context.Context) { m.Active() }, interval)
}

// decision is what the mutator does now.
type decision struct {
	// rewrite is false when every pod is left alone.
	rewrite bool
	// served maps the extended resources that the scheduler serves from a
	// DeviceClass (ModeAuto) to that class; they are left alone.
	served map[corev1.ResourceName]string
	// why explains the decision, for the log.
	why string
}

// Active reports whether any pod's extended resources are rewritten now,
// and why. The decision is logged once and again whenever it changes.
func (m *Mutator) Active() (bool, string) {
	d := m.current()
	return d.rewrite, d.why
}

// current decides, logging the decision when it changed.
func (m *Mutator) current() decision {
	d := m.decide()
	m.mu.Lock()
	defer m.mu.Unlock()
	if d.why != m.last {
		m.last = d.why
		msg := "Extended resources: leaving pods alone"
		switch {
		case d.rewrite && len(d.served) > 0:
			msg = "Extended resources: rewriting into claims those that no DeviceClass maps"
		case d.rewrite:
			msg = "Extended resources: rewriting pods into claims"
		}
		m.logger.Info(msg, "mode", m.opts.RewriteMode, "reason", d.why)
	}
	return d
}

func (m *Mutator) decide() decision {
	switch m.opts.RewriteMode {
	case RewriteAlways:
		return decision{rewrite: true, why: "--mutate-extended-resources=always"}
	case RewriteNever:
		return decision{why: "--mutate-extended-resources=never"}
	}
	classes, err := m.opts.Classes.List(labels.Everything())
	if err != nil {
		// A lister reads its cache and does not fail; should it, the
		// scheduler's own mapping is the safer guess.
		return decision{why: "cannot list DeviceClasses: " + err.Error()}
	}
	served := map[corev1.ResourceName]string{}
	var keeping []string
	for _, c := range classes {
		if c.Spec.ExtendedResourceName != nil && *c.Spec.ExtendedResourceName != "" {
			served[corev1.ResourceName(*c.Spec.ExtendedResourceName)] = c.Name
			keeping = append(keeping, c.Name)
		}
	}
	if len(keeping) == 0 {
		return decision{rewrite: true, why: fmt.Sprintf("DRAExtendedResource is off: none of the %d DeviceClasses has spec.extendedResourceName (the API server drops it without the gate)", len(classes))}
	}
	resources := make([]string, 0, len(served))
	for n := range served {
		resources = append(resources, string(n))
	}
	return decision{rewrite: true, served: served, why: fmt.Sprintf(
		"DRAExtendedResource is on: the API server kept spec.extendedResourceName of DeviceClass %s, so the scheduler serves %s from the classes; "+
			"the webhook rewrites only the extended resources that no DeviceClass maps (vGPU sizes: a mapping counts devices, it has no size)",
		firstFew(keeping), firstFew(resources))}
}

// firstFew is up to three of names, sorted, for a log line.
func firstFew(names []string) string {
	sort.Strings(names)
	if len(names) > 3 {
		names = append(names[:3:3], fmt.Sprintf("and %d more", len(names)-3))
	}
	return strings.Join(names, ", ")
}

// ServeHTTP serves AdmissionReviews of pods.
func (m *Mutator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	serveAdmission(w, r, func(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
		resp := m.Review(r.Context(), req)
		m.log(req, resp)
		return resp
	})
}

func (m *Mutator) log(req *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse) {
	logMutation(m.logger, req, resp, "Denied pod", "Rewrote pod's extended resources into claims", "Left pod alone")
}

// logMutation logs a mutator's answer to req with the object and the
// user: a denial (message denied) and a patch (patched) at the default
// level, an object left alone (left) at V(4).
func logMutation(logger klog.Logger, req *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse, denied, patched, left string) {
	kv := []any{"kind", req.Kind.Kind, "namespace", req.Namespace, "name", req.Name, "generateName", objectGenerateName(req),
		"user", req.UserInfo.Username, "uid", req.UID, "dryRun", req.DryRun != nil && *req.DryRun}
	if len(resp.Warnings) > 0 {
		kv = append(kv, "warnings", resp.Warnings)
	}
	switch {
	case !resp.Allowed:
		logger.Info(denied, append(kv, "reason", resp.Result.Message)...)
	case resp.Patch != nil:
		logger.Info(patched, append(kv, "patch", string(resp.Patch))...)
	default:
		logger.V(4).Info(left, kv...)
	}
}

func objectGenerateName(req *admissionv1.AdmissionRequest) string {
	var meta struct {
		Metadata struct {
			GenerateName string `json:"generateName"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(req.Object.Raw, &meta); err != nil {
		return ""
	}
	return meta.Metadata.GenerateName
}

// Review decides one pod. It never returns nil.
func (m *Mutator) Review(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.Kind.Group != "" || req.Kind.Kind != "Pod" || req.SubResource != "" {
		return allowedWithWarning(fmt.Sprintf("Facet's pod mutator does not handle %s; its webhook configuration should not send it", req.Kind))
	}
	if req.Operation != admissionv1.Create {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	d := m.current()
	served := d.served
	switch {
	case m.kueue():
		// Kueue counts claims of its mapped DeviceClasses, not the
		// scheduler's extended resources, so in Kueue mode every pod is
		// rewritten, whatever DRAExtendedResource says.
		served = nil
	case !d.rewrite:
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return denied(http.StatusBadRequest, metav1.StatusReasonBadRequest, "decode Pod: "+err.Error())
	}
	if _, mirror := pod.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		// A static pod's mirror cannot have claims, and the kubelet
		// runs the static pod whatever its mirror says.
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	p, err := m.plan(&pod, served)
	if err != nil {
		return denied(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid, "Facet cannot replace the pod's extended resources with DRA claims: "+strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	if len(p.claims) == 0 {
		return &admissionv1.AdmissionResponse{Allowed: true, Warnings: p.warnings}
	}
	if req.DryRun == nil || !*req.DryRun {
		for _, c := range p.claims {
			if err := m.ensureTemplate(ctx, req.Namespace, c.template); err != nil {
				return denied(http.StatusInternalServerError, metav1.StatusReasonInternalError, fmt.Sprintf("container %q: %s", c.container, err))
			}
		}
	}
	patch, err := json.Marshal(p.patch(&pod))
	if err != nil {
		return denied(http.StatusInternalServerError, metav1.StatusReasonInternalError, "encode patch: "+err.Error())
	}
	pt := admissionv1.PatchTypeJSONPatch
	return &admissionv1.AdmissionResponse{Allowed: true, Patch: patch, PatchType: &pt, Warnings: p.warnings}
}

// podClaim is one claim the mutator adds: the container at index of list
// (containers or initContainers) gets claim name from template.
type podClaim struct {
	list      string
	index     int
	container string
	name      string
	shape     shape
	template  *resourceapi.ResourceClaimTemplate
}

type plan struct {
	claims   []podClaim
	warnings []string
}

// plan works out the claims for a pod. A pod that already has an entry of
// a name the mutator would add (it was rewritten before, or its spec was
// copied from a rewritten pod) is left alone, so that re-invocation and
// re-creation never add a second claim for the same resource.
//
// served are the extended resources the scheduler serves from a
// DeviceClass: a shape of only those is left alone, and so is a container
// that asks for no other, so the API server, not the webhook, judges its
// amounts.
func (m *Mutator) plan(pod *corev1.Pod, served map[corev1.ResourceName]string) (plan, error) {
	var p plan
	var errs []error
	// Where the API server would drop firstAvailable, the template would be
	// refused (no request left): MIG shapes are then written as one
	// `exactly` request.
	preferMIG := m.opts.PreferExistingMIG
	if preferMIG {
		preferMIG, _ = m.opts.PrioritizedList.Supported()
	}
	for _, l := range []struct {
		field, short string
		containers   []corev1.Container
	}{{"initContainers", "i", pod.Spec.InitContainers}, {"containers", "c", pod.Spec.Containers}} {
		for i, c := range l.containers {
			if m.opts.Map.allServed(c.Resources, served) {
				continue
			}
			shapes, err := m.opts.Map.shapes(c.Name, c.Resources)
			kueue := err == nil && m.kueue()
			if kueue {
				shapes, err = m.kueueShapes(c.Name, shapes)
			}
			for j := range shapes {
				shapes[j].preferExisting = preferMIG && !kueue && isMIGClass(shapes[j].class)
			}
			if err != nil {
				errs = append(errs, err)
				continue
			}
			for j, s := range shapes {
				if s.servedBy(served) {
					continue
				}
				if _, err := m.opts.Classes.Get(s.class); err != nil {
					if apierrors.IsNotFound(err) {
						err = fmt.Errorf("there is no DeviceClass %s; install Facet's DeviceClasses, or map %s elsewhere in the webhook's extended resource map", s.class, s.resources[0])
					}
					errs = append(errs, containerError(c.Name, s.resources[0], "%v", err))
					continue
				}
				tpl, err := templateFor(s)
				if err != nil {
					errs = append(errs, containerError(c.Name, s.resources[0], "%v", err))
					continue
				}
				p.claims = append(p.claims, podClaim{
					list: l.field, index: i, container: c.Name, shape: s,
					name:     fmt.Sprintf("%s%s%d-%d", claimPrefix, l.short, i, j),
					template: tpl,
				})
			}
		}
	}
	if len(errs) > 0 {
		return plan{}, errors.Join(errs...)
	}
	for _, c := range p.claims {
		if slices.ContainsFunc(pod.Spec.ResourceClaims, func(rc corev1.PodResourceClaim) bool { return rc.Name == c.name }) {
			return plan{warnings: []string{fmt.Sprintf(
				"Facet's webhook left the pod's extended resources alone: it already has a resourceClaims entry %q, the name the webhook would add for container %q", c.name, c.container)}}, nil
		}
	}
	return p, nil
}

// templateFor returns the template of a shape. Its name is derived from
// the spec, so every pod of the shape in a namespace shares it, and a
// changed table makes new templates instead of reusing ones of another
// spec. A MIG template written as one `exactly` request (PreferExistingMIG
// off, Kueue mode, or an API server without firstAvailable) carries
// names.AnnotationPreferExistingMIG "false", so that the claim mutator
// leaves it as the pod mutator meant it.
func templateFor(s shape) (*resourceapi.ResourceClaimTemplate, error) {
	req := resourceapi.ExactDeviceRequest{
		DeviceClassName: s.class,
		AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
		Count:           s.count,
		Capacity:        s.capacity,
	}
	for _, sel := range s.selectors {
		req.Selectors = append(req.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: sel}})
	}
	request := resourceapi.DeviceRequest{Name: templateRequest, Exactly: &req}
	annotations := map[string]string{RewrittenAnnotation: s.describe()}
	switch {
	case s.preferExisting:
		var err error
		if request, err = existingFirstRequest(templateRequest, req); err != nil {
			return nil, fmt.Errorf("DeviceClass %s: %w", s.class, err)
		}
	case isMIGClass(s.class):
		annotations[names.AnnotationPreferExistingMIG] = "false"
	}
	spec := resourceapi.ResourceClaimTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{ManagedByLabel: ManagedByValue}},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{request},
		}},
	}
	if cfg := s.vgpuConfig(); cfg != nil {
		spec.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{
			Requests: []string{templateRequest},
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: names.Driver, Parameters: runtime.RawExtension{Raw: cfg},
			}},
		}}
	}
	data, _ := json.Marshal(spec)
	sum := sha256.Sum256(data)
	return &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{
			Name:        fmt.Sprintf("%s%s-%d-%s", claimPrefix, dnsPart(s.class, 200), s.count, hex.EncodeToString(sum[:4])),
			Labels:      map[string]string{ManagedByLabel: ManagedByValue},
			Annotations: annotations,
		},
		Spec: spec,
	}, nil
}

// vgpuConfig is the VgpuConfig (JSON) that lowers a vGPU slot's HAMi-core
// limits to the size the pod asked for; nil when it asked for no size.
func (s shape) vgpuConfig() []byte {
	if s.memoryMiB == 0 && s.cores == 0 {
		return nil
	}
	cfg := configapi.NewVgpuConfig()
	if s.memoryMiB > 0 {
		cfg.Memory = ptr.To(resource.MustParse(fmt.Sprintf("%dMi", s.memoryMiB)))
	}
	if s.cores > 0 {
		cfg.Cores = ptr.To(int32(s.cores))
	}
	data, _ := json.Marshal(cfg)
	return data
}

// describe is e.g. "nvidia.com/gpu=2" or
// "volcano.sh/vgpu-memory=4000,volcano.sh/vgpu-number=2".
func (s shape) describe() string {
	var parts []string
	for _, n := range s.resources {
		parts = append(parts, fmt.Sprintf("%s=%d", n, s.values[n]))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// dnsPart lowers s to the characters of a DNS label, "." and "/" becoming
// "-", and cuts it to max.
func dnsPart(s string, max int) string {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			b[i] = '-'
		}
	}
	if len(b) > max {
		b = b[:max]
	}
	return strings.Trim(string(b), "-")
}

// ensureTemplate creates the template unless it exists. A template of the
// name that the webhook did not make is not used: its spec could be
// anything.
func (m *Mutator) ensureTemplate(ctx context.Context, namespace string, t *resourceapi.ResourceClaimTemplate) error {
	templates := m.opts.Client.ResourceV1().ResourceClaimTemplates(namespace)
	got, err := templates.Get(ctx, t.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		got, err = templates.Create(ctx, t, metav1.CreateOptions{FieldManager: ManagedByValue})
		if err == nil {
			klog.FromContext(ctx).V(2).Info("Created ResourceClaimTemplate", "namespace", namespace, "name", t.Name, "shape", t.Annotations[RewrittenAnnotation])
			return nil
		}
		if apierrors.IsAlreadyExists(err) {
			// Another replica or request won the race.
			got, err = templates.Get(ctx, t.Name, metav1.GetOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("ResourceClaimTemplate %s/%s: %w", namespace, t.Name, err)
	}
	if got.Labels[ManagedByLabel] != ManagedByValue {
		return fmt.Errorf("ResourceClaimTemplate %s/%s exists without the label %s=%s; the webhook does not use a template it did not make", namespace, t.Name, ManagedByLabel, ManagedByValue)
	}
	return nil
}

// jsonPatchOp is one RFC 6902 operation.
type jsonPatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// pointerEscape escapes a JSON pointer token (RFC 6901): resource names
// have a "/".
func pointerEscape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// patch removes the replaced resources and adds the claims. Only the keys
// it changes are touched, so the pod's other resources keep their exact
// spelling.
func (p plan) patch(pod *corev1.Pod) []jsonPatchOp {
	var ops []jsonPatchOp
	var notes []string
	type key struct {
		list  string
		index int
	}
	hasClaims := map[key]bool{}
	for _, c := range p.claims {
		var ctr corev1.Container
		if c.list == "containers" {
			ctr = pod.Spec.Containers[c.index]
		} else {
			ctr = pod.Spec.InitContainers[c.index]
		}
		base := fmt.Sprintf("/spec/%s/%d/resources", c.list, c.index)
		for _, n := range c.shape.resources {
			if _, ok := ctr.Resources.Limits[n]; ok {
				ops = append(ops, jsonPatchOp{Op: "remove", Path: base + "/limits/" + pointerEscape(string(n))})
			}
			if _, ok := ctr.Resources.Requests[n]; ok {
				ops = append(ops, jsonPatchOp{Op: "remove", Path: base + "/requests/" + pointerEscape(string(n))})
			}
		}
		claim := corev1.ResourceClaim{Name: c.name}
		k := key{c.list, c.index}
		if len(ctr.Resources.Claims) == 0 && !hasClaims[k] {
			ops = append(ops, jsonPatchOp{Op: "add", Path: base + "/claims", Value: []corev1.ResourceClaim{claim}})
		} else {
			ops = append(ops, jsonPatchOp{Op: "add", Path: base + "/claims/-", Value: claim})
		}
		hasClaims[k] = true
		notes = append(notes, fmt.Sprintf("%s: %s -> claim %s from template %s", c.container, c.shape.describe(), c.name, c.template.Name))
	}
	for i, c := range p.claims {
		rc := corev1.PodResourceClaim{Name: c.name, ResourceClaimTemplateName: &c.template.Name}
		if i == 0 && len(pod.Spec.ResourceClaims) == 0 {
			ops = append(ops, jsonPatchOp{Op: "add", Path: "/spec/resourceClaims", Value: []corev1.PodResourceClaim{rc}})
		} else {
			ops = append(ops, jsonPatchOp{Op: "add", Path: "/spec/resourceClaims/-", Value: rc})
		}
	}
	note := strings.Join(notes, "; ")
	if pod.Annotations == nil {
		ops = append(ops, jsonPatchOp{Op: "add", Path: "/metadata/annotations", Value: map[string]string{RewrittenAnnotation: note}})
	} else {
		ops = append(ops, jsonPatchOp{Op: "add", Path: "/metadata/annotations/" + pointerEscape(RewrittenAnnotation), Value: note})
	}
	return ops
}

// joinSorted joins errors in a stable order: the resources of a container
// come from a map.
func joinSorted(errs []error) error {
	sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
	return errors.Join(errs...)
}
