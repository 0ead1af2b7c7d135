// Package claimstatus writes ResourceClaim status.devices
// (DRAResourceClaimDeviceStatus: beta and on by default in Kubernetes 1.35
// and 1.36, GA and locked on in 1.37; from 1.36 the API server also asks
// for resourceclaims/driver permission, which the chart grants) for
// the claims the kubelet plugin has prepared: one AllocatedDeviceStatus per
// prepared device, whose data says what the device really is (the GPU's
// UUID, the MIG instance's UUID and IDs, a share's enforced limits).
//
// The writer is a reconciler over the checkpoint: the driver only says
// that a claim changed, and a worker, off the prepare path, reads the
// claim's record and server-side applies the matching entries (none when
// the record is gone). Server-side apply with Facet's own field manager
// means Facet owns only the entries it wrote; another driver's stay. A
// failed write is logged and retried with backoff; it never fails a claim.
package claimstatus

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	resourceac "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
)

// FieldManager is the server-side apply field manager of Facet's entries.
const FieldManager = "facet.dev/kubelet-plugin"

// Data is the JSON in an AllocatedDeviceStatus's data: what is true of the
// prepared device. Fields that do not apply to its kind are omitted.
type Data struct {
	// Kind is the prepared device's kind: gpu (a whole GPU), mig,
	// mig-static, share (a vGPU share), slot (a vGPU slot) or
	// imex-channel.
	Kind string `json:"kind"`
	// GPUUUID is the physical GPU's UUID (a MIG instance's parent); none
	// for an IMEX channel.
	GPUUUID string `json:"gpuUUID,omitempty"`
	// ComputeDomainUID is an IMEX channel's ComputeDomain's metadata.uid:
	// the claim's channel is prepared on the node for that domain.
	ComputeDomainUID string `json:"computeDomainUID,omitempty"`
	// MIG instances only.
	MIGUUID           string     `json:"migUUID,omitempty"`
	Profile           string     `json:"profile,omitempty"`
	Placement         *Placement `json:"placement,omitempty"`
	GPUInstanceID     *int       `json:"gpuInstanceID,omitempty"`
	ComputeInstanceID *int       `json:"computeInstanceID,omitempty"`
	// Shares and slots only: the limits HAMi-core enforces (when
	// Enforced) or that the share was given (when it is the whole GPU).
	MemoryLimitBytes    *int64 `json:"memoryLimitBytes,omitempty"`
	ComputeLimitPercent *int64 `json:"computeLimitPercent,omitempty"`
	Enforced            *bool  `json:"enforced,omitempty"`
	// ComputePartitioning is how the share's SMs are partitioned, as
	// prepared: mps (an MPS client at its percentage, whose smaller CUDA
	// context HAMi-core charges to its memory, pkg/node/sharemem.UsableMPS) or time-sliced
	// (HAMi-core's throttle).
	ComputePartitioning string `json:"computePartitioning,omitempty"`
}

// Placement is a MIG instance's memory-slice range [Start, Start+Size).
type Placement struct {
	Start int `json:"start"`
	Size  int `json:"size"`
}

// DataOf is what status.devices says of one prepared device.
func DataOf(dev checkpoint.Device) Data {
	d := Data{Kind: dev.Kind, GPUUUID: dev.GPUUUID}
	if d.Kind == "" {
		d.Kind = names.KindGPU // records written before kinds existed
	}
	if m := dev.MIG; m != nil {
		gi, ci := m.GIID, m.CIID
		d.MIGUUID, d.Profile = m.UUID, m.Profile
		d.Placement = &Placement{Start: m.Start, Size: m.Size}
		d.GPUInstanceID, d.ComputeInstanceID = &gi, &ci
	}
	if s := dev.Share; s != nil {
		mem, cores, enforced := s.MemoryBytes, s.Cores, s.Enforced
		d.MemoryLimitBytes, d.ComputeLimitPercent, d.Enforced = &mem, &cores, &enforced
		d.ComputePartitioning = names.PartitioningTimeSliced
		if s.MPS {
			d.ComputePartitioning = names.PartitioningMPS
		}
	}
	return d
}

// Apply is the apply configuration that makes Facet's entries of a claim's
// status.devices those of rec: none when rec is nil or not prepared.
func Apply(namespace, name string, uid types.UID, rec *checkpoint.Claim) (*resourceac.ResourceClaimApplyConfiguration, error) {
	status := resourceac.ResourceClaimStatus()
	if rec != nil && rec.State == checkpoint.StatePrepared {
		for _, dev := range rec.Devices {
			data := DataOf(dev)
			if rec.ComputeDomain != nil && dev.Kind == names.KindIMEXChannel {
				data.ComputeDomainUID = rec.ComputeDomain.UID
			}
			raw, err := json.Marshal(data)
			if err != nil {
				return nil, err
			}
			e := resourceac.AllocatedDeviceStatus().WithDriver(names.Driver).WithPool(dev.Pool).WithDevice(dev.Device).
				WithData(runtime.RawExtension{Raw: raw})
			if dev.ShareID != nil {
				e.WithShareID(string(*dev.ShareID))
			}
			status.WithDevices(e)
		}
	}
	// The UID makes the apply fail on a claim of the same name made since,
	// rather than write another claim's status.
	return resourceac.ResourceClaim(name, namespace).WithUID(uid).WithStatus(status), nil
}

// Records reads checkpoint records (checkpoint.Store).
type Records interface {
	// Get returns a claim's record, nil if there is none.
	Get(uid types.UID) (*checkpoint.Claim, error)
}

type key struct {
	namespace, name string
	uid             types.UID
}

// Writer reconciles claims' status.devices with the checkpoint. Changed
// queues a claim; Run works the queue until its context ends.
type Writer struct {
	client  kubernetes.Interface
	records Records
	queue   workqueue.TypedRateLimitingInterface[key]
	// maxRetries bounds the retries of one change; a later change of the
	// claim queues it afresh.
	maxRetries int
}

// NewWriter returns a writer of claims' status through client, from records.
// Failed writes are retried with exponential backoff from 100 ms to 5 min,
// up to 15 times (about half an hour).
func NewWriter(client kubernetes.Interface, records Records) *Writer {
	rl := workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[key](100*time.Millisecond, 5*time.Minute),
	)
	return &Writer{
		client:     client,
		records:    records,
		queue:      workqueue.NewTypedRateLimitingQueueWithConfig(rl, workqueue.TypedRateLimitingQueueConfig[key]{Name: "facet-claim-status"}),
		maxRetries: 15,
	}
}

// Changed queues the claim for a status write. It never blocks; repeated
// changes before the write collapse into one.
func (w *Writer) Changed(namespace, name string, uid types.UID) {
	w.queue.Add(key{namespace, name, uid})
}

// Run works the queue with the given number of workers until ctx ends.
func (w *Writer) Run(ctx context.Context, workers int) {
	go func() {
		<-ctx.Done()
		w.queue.ShutDown()
	}()
	done := make(chan struct{})
	for range workers {
		go func() {
			for w.next(ctx) {
			}
			done <- struct{}{}
		}()
	}
	for range workers {
		<-done
	}
}

func (w *Writer) next(ctx context.Context) bool {
	k, quit := w.queue.Get()
	if quit {
		return false
	}
	defer w.queue.Done(k)
	logger := klog.FromContext(ctx).WithValues("claim", klog.KRef(k.namespace, k.name), "uid", k.uid)
	err := w.write(ctx, k)
	switch {
	case err == nil:
		w.queue.Forget(k)
	case w.queue.NumRequeues(k) < w.maxRetries:
		logger.Error(err, "Writing the claim's status.devices failed; retrying")
		w.queue.AddRateLimited(k)
	default:
		logger.Error(err, "Writing the claim's status.devices failed; giving up until the claim changes again")
		w.queue.Forget(k)
	}
	return true
}

// write applies the entries of the claim's current record. A claim that is
// gone, or was replaced by another of its name, needs nothing.
func (w *Writer) write(ctx context.Context, k key) error {
	rec, err := w.records.Get(k.uid)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if rec != nil && rec.State != checkpoint.StatePrepared {
		// Mid-prepare (or a failed one awaiting rollback); the outcome
		// queues the claim again.
		return nil
	}
	ac, err := Apply(k.namespace, k.name, k.uid, rec)
	if err != nil {
		return err
	}
	_, err = w.client.ResourceV1().ResourceClaims(k.namespace).ApplyStatus(ctx, ac, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case apierrors.IsConflict(err) && rec == nil:
		// A claim of the same name with another UID: not ours to clean.
		return nil
	case err != nil:
		return err
	}
	klog.FromContext(ctx).V(3).Info("Wrote status.devices", "claim", klog.KRef(k.namespace, k.name), "prepared", rec != nil)
	return nil
}
