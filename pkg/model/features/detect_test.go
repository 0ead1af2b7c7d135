package features

import (
	"context"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/facet-gpu/facet/pkg/model/names"
)

// server is a fake API server that drops the fields of the gates that are
// off, the way kube-apiserver's strategies do (dropDisabledFields).
func server(t *testing.T, on map[Gate]bool, classCreate error, class *resourceapi.DeviceClass) *fake.Clientset {
	t.Helper()
	var objs []runtime.Object
	if class != nil {
		objs = append(objs, class)
	}
	c := fake.NewClientset(objs...)
	c.Discovery().(*fakediscovery.FakeDiscovery).FakedServerVersion = &version.Info{GitVersion: "v1.35.4"}
	c.PrependReactor("create", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		create := a.(k8stesting.CreateActionImpl)
		if len(create.GetCreateOptions().DryRun) == 0 {
			t.Errorf("probe ResourceSlice created without dry-run")
		}
		s := create.GetObject().(*resourceapi.ResourceSlice).DeepCopy()
		if !on[PartitionableDevices] {
			s.Spec.SharedCounters = nil
		}
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			if !on[PartitionableDevices] {
				d.ConsumesCounters = nil
			}
			if !on[ConsumableCapacity] {
				d.AllowMultipleAllocations = nil
				for name, c := range d.Capacity {
					c.RequestPolicy = nil
					d.Capacity[name] = c
				}
			}
			if !on[DeviceTaints] {
				d.Taints = nil
			}
		}
		return true, s, nil
	})
	c.PrependReactor("create", "deviceclasses", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if classCreate != nil {
			return true, nil, classCreate
		}
		dc := a.(k8stesting.CreateAction).GetObject().(*resourceapi.DeviceClass).DeepCopy()
		if !on[ExtendedResource] {
			dc.Spec.ExtendedResourceName = nil
		}
		return true, dc, nil
	})
	return c
}

func TestDetect(t *testing.T) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "deviceclasses"}, "", nil)
	shipped := func(ext bool) *resourceapi.DeviceClass {
		dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: names.Driver}}
		if ext {
			dc.Spec.ExtendedResourceName = ptr.To("nvidia.com/gpu")
		}
		return dc
	}
	all := map[Gate]bool{PartitionableDevices: true, ConsumableCapacity: true, DeviceTaints: true, ExtendedResource: true}
	tests := []struct {
		name        string
		on          map[Gate]bool
		classCreate error
		class       *resourceapi.DeviceClass
		want        string
		extSource   string
	}{
		{
			name: "stock 1.35: every gated field dropped",
			on:   map[Gate]bool{},
			want: "DRAPartitionableDevices=false,DRAConsumableCapacity=false,DRADeviceTaints=false,DRAExtendedResource=false",
		},
		{
			name: "gates on",
			on:   all,
			want: "DRAPartitionableDevices=true,DRAConsumableCapacity=true,DRADeviceTaints=true,DRAExtendedResource=true",
		},
		{
			name: "partitionable devices alone",
			on:   map[Gate]bool{PartitionableDevices: true},
			want: "DRAPartitionableDevices=true,DRAConsumableCapacity=false,DRADeviceTaints=false,DRAExtendedResource=false",
		},
		{
			name: "consumable capacity and taints alone",
			on:   map[Gate]bool{ConsumableCapacity: true, DeviceTaints: true},
			want: "DRAPartitionableDevices=false,DRAConsumableCapacity=true,DRADeviceTaints=true,DRAExtendedResource=false",
		},
		{
			name:        "no right to create classes: the shipped class kept its extendedResourceName",
			on:          all,
			classCreate: forbidden,
			class:       shipped(true),
			want:        "DRAPartitionableDevices=true,DRAConsumableCapacity=true,DRADeviceTaints=true,DRAExtendedResource=true",
			extSource:   "DeviceClass gpu.facet.dev",
		},
		{
			name:        "no right to create classes: the shipped class lost its extendedResourceName",
			on:          map[Gate]bool{},
			classCreate: forbidden,
			class:       shipped(false),
			want:        "DRAPartitionableDevices=false,DRAConsumableCapacity=false,DRADeviceTaints=false,DRAExtendedResource=false",
			extSource:   "DeviceClass gpu.facet.dev",
		},
		{
			name:        "no right to create classes and none installed",
			on:          all,
			classCreate: forbidden,
			want:        "DRAPartitionableDevices=true,DRAConsumableCapacity=true,DRADeviceTaints=true,DRAExtendedResource=false",
			extSource:   "not determined (DeviceClass gpu.facet.dev is not installed)",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Detect(context.Background(), server(t, tc.on, tc.classCreate, tc.class), "node-a")
			if err != nil {
				t.Fatal(err)
			}
			if got.String() != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
			if got.ServerVersion != "v1.35.4" {
				t.Errorf("server version %q", got.ServerVersion)
			}
			if tc.extSource != "" && got.Source[ExtendedResource] != tc.extSource {
				t.Errorf("extended resource source %q, want %q", got.Source[ExtendedResource], tc.extSource)
			}
			if got.Source[PartitionableDevices] != sourceSlice {
				t.Errorf("partitionable source %q", got.Source[PartitionableDevices])
			}
		})
	}
}

func TestDetectFailsWhenTheProbeIsRefused(t *testing.T) {
	c := server(t, nil, nil, nil)
	c.PrependReactor("create", "resourceslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceslices"}, "", nil)
	})
	_, err := Detect(context.Background(), c, "node-a")
	if err == nil || !strings.Contains(err.Error(), "sharedCounters") {
		t.Fatalf("want an error naming the probe, got %v", err)
	}
}

func TestParseOverrides(t *testing.T) {
	tests := []struct {
		in      string
		want    string
		wantErr string
	}{
		{in: "", want: "DRAPartitionableDevices=false,DRAConsumableCapacity=false,DRADeviceTaints=false,DRAExtendedResource=false"},
		{in: "DRAPartitionableDevices=true,DRAConsumableCapacity=true", want: "DRAPartitionableDevices=true,DRAConsumableCapacity=true,DRADeviceTaints=false,DRAExtendedResource=false"},
		{in: "DRAPartitionableDevices=false", want: "DRAPartitionableDevices=false,DRAConsumableCapacity=false,DRADeviceTaints=false,DRAExtendedResource=false"},
		{in: "DRAPartitionable=true", wantErr: `unknown gate "DRAPartitionable"`},
		{in: "DRAConsumableCapacity=yes", wantErr: "DRAConsumableCapacity"},
		{in: "DRAConsumableCapacity", wantErr: "--feature-gates"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			o, err := ParseOverrides(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := Stock("test").Apply(o)
			if got.String() != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
			for g := range o {
				if got.Source[g] != "--feature-gates" {
					t.Errorf("%s: source %q", g, got.Source[g])
				}
			}
		})
	}
}

func TestDescribe(t *testing.T) {
	s := Stock("dry-run ResourceSlice")
	s.ServerVersion = "v1.35.4"
	d := s.Describe()
	for _, want := range []string{"v1.35.4", "not enforced: DRAPartitionableDevices", "static", "slots"} {
		if !strings.Contains(d, want) {
			t.Errorf("%q lacks %q", d, want)
		}
	}
	if strings.Contains(AllOn("x").Describe(), "not enforced") {
		t.Errorf("all on: %s", AllOn("x").Describe())
	}
}
