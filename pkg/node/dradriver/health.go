package dradriver

import (
	"time"

	"google.golang.org/grpc"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"

	"github.com/facet-gpu/facet/pkg/node/gpuhealth"
)

// healthResend is how often NodeWatchResources repeats the full list
// without a change: the kubelet marks a device whose status is older than
// its timeout (healthTimeout) Unknown.
const (
	healthResend  = 20 * time.Second
	healthTimeout = 60
)

// SetFaults replaces the GPUs' health faults (package health). From then
// on prepare refuses claims on GPUs with a fatal fault, GPUHealth reports
// them, and the kubelet's health streams are told.
func (d *Driver) SetFaults(faults map[string]gpuhealth.Fault) {
	d.mu.Lock()
	d.faults = make(map[string]gpuhealth.Fault, len(faults))
	for k, v := range faults {
		d.faults[k] = v
	}
	for ch := range d.healthSubs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	d.mu.Unlock()
}

// GPUHealth returns, by GPU UUID, why each unhealthy GPU is unhealthy: a
// start-up problem confined to it (UnusableGPUs) or a health fault. A GPU
// that is absent is healthy.
func (d *Driver) GPUHealth() map[string]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]string, len(d.unusable)+len(d.faults))
	for k, f := range d.faults {
		out[k] = f.String()
	}
	for k, v := range d.unusable {
		out[k] = v
	}
	return out
}

// NodeWatchResources streams the health of every device in the node's
// pool to the kubelet (KEP-4680, DRAResourceHealth v1alpha1; the kubelet
// calls it where ResourceHealthStatus is on, and shows it in the status of
// the pods using the devices): the full list at once, on every change,
// and every healthResend. Every device of a GPU that is unusable or has a
// fault is UNHEALTHY.
func (d *Driver) NodeWatchResources(_ *drahealthv1alpha1.NodeWatchResourcesRequest, stream grpc.ServerStreamingServer[drahealthv1alpha1.NodeWatchResourcesResponse]) error {
	wake := make(chan struct{}, 1)
	d.mu.Lock()
	d.healthSubs[wake] = struct{}{}
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		delete(d.healthSubs, wake)
		d.mu.Unlock()
	}()
	tick := time.NewTicker(healthResend)
	defer tick.Stop()
	for {
		if err := stream.Send(d.deviceHealth()); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-wake:
		case <-tick.C:
		}
	}
}

func (d *Driver) deviceHealth() *drahealthv1alpha1.NodeWatchResourcesResponse {
	bad := d.GPUHealth()
	now := time.Now().Unix()
	resp := &drahealthv1alpha1.NodeWatchResourcesResponse{}
	for _, g := range d.inv.GPUs {
		status := drahealthv1alpha1.HealthStatus_HEALTHY
		if _, sick := bad[g.UUID]; sick {
			status = drahealthv1alpha1.HealthStatus_UNHEALTHY
		}
		for _, dev := range g.Devices {
			resp.Devices = append(resp.Devices, &drahealthv1alpha1.DeviceHealth{
				Device:                    &drahealthv1alpha1.DeviceIdentifier{PoolName: d.nodeName, DeviceName: dev.Name},
				Health:                    status,
				LastUpdatedTime:           now,
				HealthCheckTimeoutSeconds: healthTimeout,
			})
		}
	}
	return resp
}
