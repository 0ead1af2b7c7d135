package v1alpha1

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Config is what Decode returns: a *VgpuConfig, a *GpuConfig or a
// *ComputeDomainChannelConfig.
type Config interface {
	runtime.Object
	// Default sets apiVersion, kind and every unset field to its default.
	Default()
	// Validate checks every set field; see VgpuConfig.Validate.
	Validate() error
}

var (
	_ Config = &VgpuConfig{}
	_ Config = &GpuConfig{}
	_ Config = &ComputeDomainChannelConfig{}
)

var (
	// scheme holds this package's kinds and nothing else, so the decoder
	// cannot produce any other type.
	scheme = runtime.NewScheme()
	// decoder is apimachinery's JSON serializer in strict mode: unknown and
	// duplicate fields are errors, field names are case-sensitive. YAML is
	// off: parameters reach the driver as JSON.
	decoder = json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme, scheme,
		json.SerializerOptions{Yaml: false, Pretty: false, Strict: true})
	supportedKinds = []string{GpuConfigKind, VgpuConfigKind, ComputeDomainChannelConfigKind}
)

func init() {
	utilruntime.Must(AddToScheme(scheme))
}

// Decode strictly decodes one opaque parameters object of driver
// gpu.facet.dev and validates it. It does not default: unset fields stay
// nil, so that configs can still be merged. The result is a *VgpuConfig, a
// *GpuConfig or a *ComputeDomainChannelConfig.
//
// Errors: input that is not a JSON object (YAML included), a missing or
// other apiVersion, a missing or unknown kind, unknown or duplicate fields,
// wrong JSON types, and invalid values. Once the kind is known, messages
// start with it, e.g. `VgpuConfig: taskPriority: Invalid value: 7: must be
// between 0 and 1, inclusive`; field paths are relative to the parameters
// object.
//
// The same function serves the kubelet plugin and a validating webhook.
func Decode(raw []byte) (Config, error) {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 {
		return nil, errors.New("parameters: Required value: a JSON object with apiVersion " +
			SchemeGroupVersion.String() + " and kind " + strings.Join(supportedKinds, ", "))
	}
	if trimmed[0] != '{' {
		return nil, errors.New("parameters: must be a JSON object (YAML is not accepted)")
	}

	// Check apiVersion and kind first, for messages that name the field
	// (the scheme's own "no kind is registered" error names the scheme by
	// its Go call site).
	gvk, err := json.DefaultMetaFactory.Interpret(raw)
	if err != nil {
		return nil, fmt.Errorf("parameters: %w", err)
	}
	var errs field.ErrorList
	switch gv := gvk.GroupVersion(); {
	case gvk.Group == "" && gvk.Version == "":
		errs = append(errs, field.Required(field.NewPath("apiVersion"), "must be "+SchemeGroupVersion.String()))
	case gv != SchemeGroupVersion:
		errs = append(errs, field.NotSupported(field.NewPath("apiVersion"), gv.String(), []string{SchemeGroupVersion.String()}))
	}
	switch {
	case gvk.Kind == "":
		errs = append(errs, field.Required(field.NewPath("kind"), "must be one of "+strings.Join(supportedKinds, ", ")))
	case !contains(supportedKinds, gvk.Kind):
		errs = append(errs, field.NotSupported(field.NewPath("kind"), gvk.Kind, supportedKinds))
	}
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}

	obj, _, err := decoder.Decode(raw, nil, nil)
	if err != nil {
		// Strict errors (unknown, duplicate fields) come with a decoded
		// object; they are errors all the same.
		return nil, fmt.Errorf("%s: %w", gvk.Kind, err)
	}
	cfg, ok := obj.(Config)
	if !ok {
		return nil, fmt.Errorf("%s: decoded to unexpected type %T", gvk.Kind, obj)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", gvk.Kind, err)
	}
	return cfg, nil
}
