package gpuhealth

import (
	"sync"
	"time"

	"google.golang.org/grpc"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"

	"github.com/facet-gpu/facet/pkg/model/inventory"
)

// kubeletResend is how often Kubelet.Watch repeats the full list without a
// change: the kubelet marks a device whose status is older than its
// timeout (kubeletTimeout, seconds) Unknown.
const (
	kubeletResend  = 20 * time.Second
	kubeletTimeout = 60
)

// Kubelet streams the health of every device in the node's pool to the
// kubelet (KEP-4680, DRAResourceHealth v1alpha1: the kubelet calls the
// plugin's NodeWatchResources where ResourceHealthStatus is on, and shows
// the health in the status of the pods using the devices). A device is
// UNHEALTHY when its GPU is. Safe for concurrent use.
type Kubelet struct {
	pool string
	inv  *inventory.Inventory
	// unhealthy is, by GPU UUID, why each unhealthy GPU is unhealthy.
	unhealthy func() map[string]string

	mu sync.Mutex
	// subs are the streams open now, each woken by Changed.
	subs map[chan struct{}]struct{}
}

// NewKubelet streams the devices of inv, in the pool named pool (the
// node's), each UNHEALTHY while unhealthy names its GPU.
func NewKubelet(pool string, inv *inventory.Inventory, unhealthy func() map[string]string) *Kubelet {
	return &Kubelet{pool: pool, inv: inv, unhealthy: unhealthy, subs: map[chan struct{}]struct{}{}}
}

// Changed wakes every open stream: what unhealthy returns has changed.
func (k *Kubelet) Changed() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for ch := range k.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Watch sends the full list of devices at once, on every Changed, and
// every kubeletResend, until the stream's context ends (nil) or a send
// fails (its error).
func (k *Kubelet) Watch(stream grpc.ServerStreamingServer[drahealthv1alpha1.NodeWatchResourcesResponse]) error {
	wake := make(chan struct{}, 1)
	k.mu.Lock()
	k.subs[wake] = struct{}{}
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		delete(k.subs, wake)
		k.mu.Unlock()
	}()
	tick := time.NewTicker(kubeletResend)
	defer tick.Stop()
	for {
		if err := stream.Send(k.devices()); err != nil {
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

func (k *Kubelet) devices() *drahealthv1alpha1.NodeWatchResourcesResponse {
	bad := k.unhealthy()
	now := time.Now().Unix()
	resp := &drahealthv1alpha1.NodeWatchResourcesResponse{}
	for _, g := range k.inv.GPUs {
		status := drahealthv1alpha1.HealthStatus_HEALTHY
		if _, sick := bad[g.UUID]; sick {
			status = drahealthv1alpha1.HealthStatus_UNHEALTHY
		}
		for _, dev := range g.Devices {
			resp.Devices = append(resp.Devices, &drahealthv1alpha1.DeviceHealth{
				Device:                    &drahealthv1alpha1.DeviceIdentifier{PoolName: k.pool, DeviceName: dev.Name},
				Health:                    status,
				LastUpdatedTime:           now,
				HealthCheckTimeoutSeconds: kubeletTimeout,
			})
		}
	}
	return resp
}
