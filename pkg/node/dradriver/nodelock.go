package dradriver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"go.etcd.io/etcd/client/pkg/v3/fileutil"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/klog/v2"
)

// nodeLock serialises this process's prepares, unprepares and start-up
// restore with those of other plugin processes on the node: during a
// rolling update (kubeletplugin.RollingUpdate) the kubelet may call the old
// and the new instance at once, and a claim prepared by one may be
// unprepared by the other.
//
// It is an flock(2) on a file in the state directory, taken by the first
// call in flight in this process and released when the last one returns:
// claims within a process still run in parallel (the driver serialises them
// per claim and per device), and two processes take turns. The lock dies
// with its holder, so a killed instance never blocks the other.
//
// The file also holds a token naming the last holder's change: a holder
// that prepared or unprepared something writes a new random token before
// it lets go. A process that finds a token other than its own when it
// takes the lock reloads its reservations from the checkpoint, which the
// other process changed meanwhile; everything else the driver keeps in
// memory (the GPUs' CDI edits, the unusable GPUs found at start) does not
// depend on which claims are prepared.
type nodeLock struct {
	path string
	// reload rebuilds the in-memory reservations from the checkpoint; it
	// runs holding the file lock, with no call of this process in flight.
	reload func(context.Context) error

	// mu is held while the file lock is taken, so the process's other
	// calls wait for it rather than each blocking in flock.
	mu    sync.Mutex
	file  *fileutil.LockedFile
	users int
	dirty bool
	// seen is the token of the last change this process knows of.
	seen string
}

// errNodeLock wraps failures to take or read the node lock.
var errNodeLock = errors.New("node lock")

// acquire takes the node lock for one call (blocking while another process
// holds it) and reloads the reservations if another process changed the
// checkpoint since this one last held it; fresh says that the caller reads
// the whole checkpoint itself (the restore at start), so there is nothing
// to reload. Every acquire is paired with a release.
func (l *nodeLock) acquire(ctx context.Context, fresh bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.users > 0 {
		l.users++
		return nil
	}
	f, err := fileutil.LockFile(l.path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("%w %s: %v", errNodeLock, l.path, err)
	}
	token, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<10))
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("%w %s: %v", errNodeLock, l.path, err)
	}
	if string(token) != l.seen && !fresh {
		klog.FromContext(ctx).V(2).Info("Another plugin instance changed the checkpoint; reloading reservations", "lock", l.path)
		if err := l.reload(ctx); err != nil {
			_ = f.Close()
			return fmt.Errorf("reload the checkpoint after another plugin instance changed it: %w", err)
		}
	}
	l.seen = string(token)
	l.file, l.users = f, 1
	return nil
}

// release ends one call's hold; changed says that it may have changed the
// checkpoint. The last release in flight lets the file lock go, after
// writing a new token if anything changed.
func (l *nodeLock) release(ctx context.Context, changed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dirty = l.dirty || changed
	if l.users--; l.users > 0 {
		return
	}
	if l.dirty {
		token := string(uuid.NewUUID())
		// No fsync: the token matters only to processes running now; a
		// reboot ends them all, and each start reads the checkpoint.
		if err := l.file.Truncate(0); err == nil {
			_, err = l.file.WriteAt([]byte(token), 0)
			if err != nil {
				klog.FromContext(ctx).Error(err, "Writing the node lock's token; the other plugin instance may miss this change", "lock", l.path)
			}
		}
		l.seen, l.dirty = token, false
	}
	_ = l.file.Close()
	l.file = nil
}
