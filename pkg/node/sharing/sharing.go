// Package sharing is the one home of the node's sharing mechanisms as they
// are now: HAMi-core, which holds a vGPU share or slot to its memory (and,
// time-sliced, throttles its SMs), and MPS, which partitions a GPU's SMs
// among its shares. Prepare, restore, the slices and the metrics ask it, never
// a copy of its state.
//
// Either mechanism may be missing when the plugin starts (facet-mps not
// running yet, HAMi-core's library not installed yet) and arrive later, or
// go away. Mechanisms adopts one when it arrives and drops it when it goes,
// without a restart: Refresh opens what is missing and probes what is
// there, and returns the changes, which the plugin turns into republished
// slices, Events and metrics. Nothing waits for a mechanism: whole GPUs and
// MIG devices need neither, and are published as soon as NVML is read.
package sharing

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/node/hami"
	"github.com/facet-gpu/facet/pkg/node/mps"
)

// Mechanism names a sharing mechanism, as Events, logs and the metric
// facet_sharing_mechanism_available{mechanism} spell it.
type Mechanism string

const (
	// HAMiCore is HAMi-core's libvgpu.so: every enforced share's and
	// slot's memory limit, and the SM throttle of a time-sliced one.
	HAMiCore Mechanism = "hami-core"
	// MPS is the node's facet-mps, which runs one MPS control daemon per
	// GPU with MPS-partitioned shares.
	MPS Mechanism = "mps"
)

// ShareEditor sets up HAMi-core for a claim's enforced vGPU shares
// (package hami).
type ShareEditor interface {
	// CacheDir is the claim's HAMi-core accounting region.
	CacheDir(claimUID types.UID) (string, error)
	// Edits are a claim's HAMi-core edits, with a fresh accounting region.
	Edits(claimUID types.UID, shares []hami.Share, cfg *configapi.VgpuConfig) (*cdispec.ContainerEdits, error)
	// RebuildEdits are the same edits, keeping the region containers use.
	RebuildEdits(claimUID types.UID, shares []hami.Share, cfg *configapi.VgpuConfig) (*cdispec.ContainerEdits, error)
	// Cleanup removes a claim's accounting region.
	Cleanup(claimUID types.UID) error
	// ClaimCaches lists the claims that have an accounting region.
	ClaimCaches() ([]types.UID, error)
}

// Partitioner runs the MPS control daemons that partition GPUs' SMs among
// the vGPU shares and slots on them (package mps, through facet-mps). The
// driver tells it which claims hold which GPU; it keeps one daemon per held
// GPU.
type Partitioner interface {
	// Acquire makes the claim, whose processes run as Unix UID user, a
	// holder of the GPU's daemon, starting or adopting it; a
	// *mps.UserConflictError when the daemon serves another UID.
	Acquire(ctx context.Context, gpuUUID string, claim types.UID, user int64) error
	// Release drops the claim from every GPU, stopping daemons left
	// without holders.
	Release(ctx context.Context, claim types.UID) error
	// Edits are a share's CDI edits for the GPU's daemon, with its cores
	// in percent (0: best effort, no partition).
	Edits(gpuUUID string, cores int64) *cdispec.ContainerEdits
	// Daemon is the GPU's live daemon, nil if none.
	Daemon(gpuUUID string) *mps.Record
	// Restore hands over the holders the checkpoint records (by GPU,
	// each claim's UID), and returns the GPUs whose daemon had to be
	// started again.
	Restore(ctx context.Context, holders map[string]map[types.UID]int64) ([]string, error)
	// Check restarts dead daemons and returns their holders by GPU; an
	// error wrapping mps.ErrHoldersLost when the holders must be handed
	// over again (Restore).
	Check(ctx context.Context) (map[string][]types.UID, error)
}

var (
	_ ShareEditor = (*hami.Editor)(nil)
	_ Partitioner = (*mps.Manager)(nil)
)

// ErrOff is wrapped by the reason of a mechanism an admin turned off
// (--mps=off): the node's shares are then time-sliced by configuration,
// not for want of a mechanism that should be there.
var ErrOff = errors.New("turned off")

// Off reports whether why says the mechanism was turned off by
// configuration, or is nil (never configured).
func Off(why error) bool { return why == nil || errors.Is(why, ErrOff) }

// Opener opens a mechanism: the mechanism, or why it is unavailable now.
type Opener[T any] func(ctx context.Context) (T, error)

// Prober says whether an open mechanism still works; an error says why not.
type Prober[T any] func(ctx context.Context, m T) error

// Options configure New. A nil opener means the mechanism is off for good
// (its Off reason says why, e.g. "--mps=off"); it is then never retried.
type Options struct {
	OpenHAMi  Opener[ShareEditor]
	ProbeHAMi Prober[ShareEditor]
	// HAMiOff is why HAMi-core is off when OpenHAMi is nil; nil: the
	// plugin runs without --hami-library, and a claim that needs it fails
	// saying so.
	HAMiOff error

	OpenMPS  Opener[Partitioner]
	ProbeMPS Prober[Partitioner]
	// MPSOff is why MPS is off when OpenMPS is nil.
	MPSOff error
}

// Change is a mechanism that arrived (Available) or went (Why says why).
type Change struct {
	Mechanism Mechanism
	Available bool
	// Off: unavailable because configuration turned it off or never
	// configured it (--mps=off, no --hami-library), not for want of it.
	Off bool
	// Why is why the mechanism is unavailable now; empty when Available.
	Why string
}

func (c Change) String() string {
	if c.Available {
		return fmt.Sprintf("%s available", c.Mechanism)
	}
	return fmt.Sprintf("%s unavailable: %s", c.Mechanism, c.Why)
}

// Set is the node's sharing mechanisms. Safe for concurrent use; the zero
// value has neither mechanism, for no reason (use New or Fixed).
type Set struct {
	o Options

	mu      sync.RWMutex
	hami    ShareEditor
	hamiErr error
	mps     Partitioner
	mpsErr  error
	// known: each mechanism's state has been decided once (by Refresh or
	// Fixed), so the first Refresh reports every mechanism.
	known bool
	// pending are changes made outside Refresh (OpenHAMi), which the next
	// Refresh reports.
	pending []Change
}

// New returns the mechanisms Options describe, none open yet: call Refresh.
func New(o Options) *Set {
	return &Set{o: o, hamiErr: unknown(o.OpenHAMi, o.HAMiOff), mpsErr: unknown(o.OpenMPS, o.MPSOff)}
}

func unknown[T any](open Opener[T], off error) error {
	if open == nil {
		return off
	}
	return errors.New("not checked yet")
}

// Fixed returns mechanisms that never change: what a test or a one-shot
// tool (facetctl node-check) opened itself. A nil value with its reason is
// an unavailable mechanism; a typed nil pointer counts as nil.
func Fixed(h ShareEditor, hamiErr error, p Partitioner, mpsErr error) *Set {
	if e, ok := h.(*hami.Editor); ok && e == nil {
		h = nil
	}
	if m, ok := p.(*mps.Manager); ok && m == nil {
		p = nil
	}
	return &Set{hami: h, hamiErr: hamiErr, mps: p, mpsErr: mpsErr, known: true}
}

// HAMi is HAMi-core's editor, or nil and why it is unavailable (a nil
// reason: the plugin runs without --hami-library).
func (s *Set) HAMi() (ShareEditor, error) {
	if s == nil {
		return nil, nil
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.hami, s.hamiErr
}

// OpenHAMi is HAMi at once for a claim that needs it: where HAMi-core is
// configured but was missing at the last look, it looks again now, so a
// share prepared right after the hami-core DaemonSet installed the library
// does not wait for the next Refresh (and the kubelet's back-off after a
// failed prepare). The next Refresh reports the arrival.
func (s *Set) OpenHAMi(ctx context.Context) (ShareEditor, error) {
	if h, why := s.HAMi(); h != nil || s == nil || s.o.OpenHAMi == nil {
		return h, why
	}
	h, err := s.o.OpenHAMi(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.hami != nil:
		// Refresh adopted it meanwhile.
	case err != nil || h == nil:
		if err == nil {
			err = errors.New("opener returned nothing")
		}
		s.hamiErr = err
	default:
		s.hami, s.hamiErr = h, nil
		s.pending = append(s.pending, Change{Mechanism: HAMiCore, Available: true})
	}
	return s.hami, s.hamiErr
}

// MPS is the node's partitioner, or nil and why MPS is unavailable.
func (s *Set) MPS() (Partitioner, error) {
	if s == nil {
		return nil, errors.New("no sharing mechanisms configured")
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.mps, s.mpsErr
}

// ComputePartitioning is how shares and slots are held to their cores now:
// names.PartitioningMPS while MPS is available, else
// names.PartitioningTimeSliced (HAMi-core's throttle, which does not hold
// for GEMMs: docs/mps.md). Published as the shares' and slots'
// computePartitioning attribute, which the shipped DeviceClasses select on.
func (s *Set) ComputePartitioning() string {
	if p, _ := s.MPS(); p != nil {
		return names.PartitioningMPS
	}
	return names.PartitioningTimeSliced
}

// Refresh opens the mechanisms that are missing and probes the ones that
// are open, and returns what changed since the last call: each mechanism
// that arrived or went. The first call reports every mechanism's state.
// Openers and probers run without the lock held, so prepares that read
// the mechanisms never wait for facet-mps to answer.
func (s *Set) Refresh(ctx context.Context) []Change {
	s.mu.RLock()
	h, p, first := s.hami, s.mps, !s.known
	s.mu.RUnlock()

	newH, hErr, hChanged := refresh(ctx, h, s.o.OpenHAMi, s.o.ProbeHAMi, s.o.HAMiOff)
	newP, pErr, pChanged := refresh(ctx, p, s.o.OpenMPS, s.o.ProbeMPS, s.o.MPSOff)

	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.pending
	s.pending = nil
	// OpenHAMi adopted HAMi-core meanwhile: reported above, kept.
	raced := s.hami != h
	if s.o.OpenHAMi != nil && !raced {
		s.hami, s.hamiErr = newH, hErr
	}
	hChanged = hChanged && !raced
	if s.o.OpenMPS != nil {
		s.mps, s.mpsErr = newP, pErr
	}
	if hChanged || first {
		out = append(out, change(HAMiCore, s.hami != nil, s.hamiErr))
	}
	if pChanged || first {
		out = append(out, change(MPS, s.mps != nil, s.mpsErr))
	}
	s.known = true
	return out
}

func change(m Mechanism, up bool, why error) Change {
	c := Change{Mechanism: m, Available: up}
	if !up {
		c.Off = Off(why)
		c.Why = "not configured"
		if why != nil {
			c.Why = why.Error()
		}
	}
	return c
}

// refresh probes an open mechanism, or opens a missing one; changed says
// whether it arrived or went.
func refresh[T comparable](ctx context.Context, cur T, open Opener[T], probe Prober[T], off error) (T, error, bool) {
	var zero T
	if open == nil {
		return cur, off, false
	}
	if cur != zero {
		if probe == nil {
			return cur, nil, false
		}
		if err := probe(ctx, cur); err != nil {
			return zero, err, true
		}
		return cur, nil, false
	}
	m, err := open(ctx)
	if err != nil || m == zero {
		if err == nil {
			err = errors.New("opener returned nothing")
		}
		return zero, err, false
	}
	return m, nil, true
}
