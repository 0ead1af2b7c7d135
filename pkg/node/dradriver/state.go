package dradriver

import (
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"

	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/node/claimuid"
	"github.com/facet-gpu/facet/pkg/node/gpuhealth"
	"github.com/facet-gpu/facet/pkg/node/sharing"
)

// Driver implements kubeletplugin.DRAPlugin (New, and the kubelet's calls,
// in driver.go). It plans a claim against the inventory (plan.go), admits
// it onto the node's devices (held), carves its MIG instances (mig.go),
// writes its CDI spec (spec) with the MPS partition its shares join
// (mps), and records every step in the checkpoint (prepare.go); at start
// it restores what the checkpoint records (restore.go). What the outside
// sees: observer, scrape.go, and the kubelet's health stream.
type Driver struct {
	nodeName string
	inv      *inventory.Inventory
	// gpus finds an inventory GPU by UUID.
	gpus  map[string]*inventory.GPU
	store Store
	mig   MIGManager
	spec  *specs
	// sharing is the node's sharing mechanisms as they are now
	// (HAMi-core, MPS), adopted and dropped while the plugin runs.
	sharing *sharing.Set
	mps     *mpsClients
	// held is what the GPUs hold and which take new claims.
	held   *ledger
	obs    *observer
	health *gpuhealth.Kubelet
	fail   func(string)
	// bootID is this boot's ID; "" if it could not be read, in which case
	// records are verified, never judged to be from another boot.
	bootID string
	// destroyUnowned is --destroy-unowned-mig.
	destroyUnowned bool
	// nodeLock is Options.NodeLock's; nil without one.
	nodeLock *nodeLock
	// domains is Options.Domains; cdMu serialises what decides the node's
	// compute-domain label from the checkpoint (channel.go).
	domains    ComputeDomains
	cdMu       sync.Mutex
	daemonWait time.Duration

	mu sync.Mutex
	// busy marks claims being prepared or unprepared, so two calls for one
	// claim never interleave.
	busy map[types.UID]bool

	drahealthv1alpha1.UnimplementedDRAResourceHealthServer
}

// lock marks a claim busy; a second call for the same claim fails fast and
// the kubelet retries it. A UID that cannot name the claim's files
// (claimuid.Validate) is refused first.
func (d *Driver) lock(uid types.UID) error {
	if err := claimuid.Validate(uid); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.busy[uid] {
		return fmt.Errorf("another prepare or unprepare of this claim is in progress")
	}
	d.busy[uid] = true
	return nil
}

func (d *Driver) unlock(uid types.UID) {
	d.mu.Lock()
	delete(d.busy, uid)
	d.mu.Unlock()
}

// failpoint lets a test stop the plugin at a named step (Options.Failpoint).
func (d *Driver) failpoint(name string) {
	if d.fail != nil {
		d.fail(name)
	}
}
