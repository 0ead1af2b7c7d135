// Package checkpoint records which ResourceClaims the plugin has prepared,
// so that prepare and unprepare stay idempotent across plugin restarts,
// upgrades and reboots.
//
// Each claim has a file of its own, <dir>/<claimUID>.json, holding a version,
// a SHA-256 checksum and the claim's record. A file is replaced atomically
// (write a temp file, rename), so a crash leaves either the old record or
// the new one. Durability comes from a journal with group commit (see
// journal.go): concurrent writes share one fdatasync. Because records are
// separate, a corrupt file fails only its own claim: the others load, and
// the plugin starts.
package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/types"

	"github.com/facet-gpu/facet/pkg/claimuid"

	"github.com/facet-gpu/facet/pkg/atomicfile"
)

// Version is the record format written by this build. Older versions are
// read and upgraded in place on the next write; newer ones are refused
// rather than misread.
const Version = 1

// State is how far preparing a claim got.
type State string

const (
	// StatePreparing: devices are reserved and side effects (CDI spec, MIG
	// instances) may exist. A restart finds it and rolls it back.
	StatePreparing State = "Preparing"
	// StatePrepared: the CDI spec is written and the kubelet was (or will
	// be) told the CDI device IDs.
	StatePrepared State = "Prepared"
)

// Claim is the record of one prepared claim.
type Claim struct {
	UID       types.UID `json:"uid"`
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	State     State     `json:"state"`
	// CDISpec is the file name of the claim's CDI spec in the CDI directory.
	CDISpec string `json:"cdiSpec,omitempty"`
	// CDISpecHash is the SHA-256 of the spec's content as written, so a
	// re-prepare can tell a spec lost or truncated since from a good one.
	CDISpecHash string `json:"cdiSpecHash,omitempty"`
	// BootID is the node's boot ID (/proc/sys/kernel/random/boot_id) when
	// the record was written. A record from another boot describes MIG
	// instances and CDI specs (on a tmpfs) that the reboot took away, and
	// GI/CI IDs that NVML may since have given to someone else's
	// instances. Empty in records of earlier versions.
	BootID string `json:"bootID,omitempty"`
	// Devices are the claim's devices from this driver, in allocation order.
	Devices []Device `json:"devices"`
}

// Device is one allocated device as prepared.
type Device struct {
	// Requests are the claim's request names the device was allocated for.
	Requests []string `json:"requests"`
	Pool     string   `json:"pool"`
	// Device is the DRA device name, e.g. "gpu-3".
	Device string `json:"device"`
	// ShareID is set for a share of a multi-allocatable device.
	ShareID *types.UID `json:"shareID,omitempty"`
	// GPUUUID is the physical GPU's UUID, recorded so that a changed
	// inventory (a GPU swapped or re-indexed) is detected, not trusted.
	GPUUUID string `json:"gpuUUID"`
	// CDIDeviceIDs returned to the kubelet, e.g. "gpu.facet.dev/claim=<uid>-gpu-3".
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
	// Kind is "gpu" (a whole GPU), "mig" or "share" (a vGPU share).
	Kind string `json:"kind"`
	// MIG is set for a MIG device.
	MIG *MIG `json:"mig,omitempty"`
	// Share is set for a vGPU share.
	Share *Share `json:"share,omitempty"`
}

// MIG records a MIG device's intent (profile and placement, written before
// any NVML call) and, once created, its instance IDs.
type MIG struct {
	Profile     string `json:"profile"`
	GIProfileID int    `json:"giProfileID"`
	CIProfileID int    `json:"ciProfileID"`
	Start       int    `json:"start"`
	Size        int    `json:"size"`
	// Created is set once the GPU and compute instances exist; until then
	// GIID, CIID and UUID are unknown, and a rollback looks the instance up
	// by profile and placement.
	Created bool   `json:"created"`
	GIID    int    `json:"giID"`
	CIID    int    `json:"ciID"`
	UUID    string `json:"uuid,omitempty"`
}

// Share records a vGPU share's consumed capacity.
type Share struct {
	// MemoryBytes is the consumed memory in bytes.
	MemoryBytes int64 `json:"memoryBytes"`
	// Cores is the consumed SM time in percent (0 = best effort).
	Cores int64 `json:"cores"`
	// Enforced is false for a share that takes the whole GPU, or whose
	// config opted out: HAMi-core is not injected.
	Enforced bool `json:"enforced"`
}

// ErrCorrupt marks a record that cannot be trusted.
var ErrCorrupt = errors.New("corrupt checkpoint")

type envelope struct {
	Version  int             `json:"version"`
	Checksum string          `json:"checksum"`
	Claim    json.RawMessage `json:"claim"`
}

// Store is a directory of claim records. It is safe for concurrent use on
// different claims; callers serialise work on one claim.
type Store struct {
	dir string
	j   *journal
	// gate is held shared by each Put and Delete from its journal entry
	// to its file change, and exclusively by compaction, which needs the
	// files to match the journal.
	gate sync.RWMutex
}

// Open creates dir (0700) if needed. Unless another process has the store
// open, it replays the journal that a power loss or a crash left (every
// record file is made to match it, durably) and empties it. It fails if a
// record the journal names cannot be restored, e.g. in a read-only
// directory after a power loss.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("checkpoint directory: %w", err)
	}
	j, err := openJournal(dir)
	if err != nil {
		return nil, err
	}
	s := &Store{dir: dir, j: j}
	alone, err := j.tryExclusive()
	if err != nil {
		j.close()
		return nil, err
	}
	if alone {
		err := s.settle()
		if serr := j.shared(); err == nil {
			err = serr
		}
		if err != nil {
			j.close()
			return nil, fmt.Errorf("replay checkpoint journal %s: %w", j.path, err)
		}
	} else if st, err := os.Stat(j.path); err == nil {
		j.size = st.Size()
	}
	j.compactAt = j.size + j.limit
	return s, nil
}

// Close releases the store's lock on its directory. The store must not be
// used after.
func (s *Store) Close() error { return s.j.close() }

// settle makes every record file the journal names match the journal's
// last entry for it, durably, then empties the journal. It needs the
// directory's flock exclusively.
func (s *Store) settle() error {
	data, err := s.j.readAll()
	if err != nil || len(data) == 0 {
		return err
	}
	entries, _ := parseJournal(data)
	last := make(map[types.UID]entry, len(entries))
	for _, e := range entries {
		if claimuid.Validate(e.uid) == nil {
			last[e.uid] = e
		}
	}
	// The files to fsync, in parallel: this runs while every write waits
	// (compaction), and the file system merges concurrent fsyncs into one
	// journal commit.
	var g errgroup.Group
	g.SetLimit(16)
	for uid, e := range last {
		path := s.path(uid)
		switch e.op {
		case opPut:
			if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, e.data) {
				g.Go(func() error {
					if err := atomicfile.Sync(path); err != nil {
						return fmt.Errorf("checkpoint of claim %s: %w", uid, err)
					}
					return nil
				})
				continue
			}
			if err := atomicfile.Write(s.dir, filepath.Base(path), tempPrefix(uid), e.data, 0o600); err != nil {
				return errors.Join(fmt.Errorf("checkpoint of claim %s: %w", uid, err), g.Wait())
			}
		case opDelete:
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return errors.Join(fmt.Errorf("delete checkpoint of claim %s: %w", uid, err), g.Wait())
			}
		}
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if err := atomicfile.SyncDir(s.dir); err != nil {
		return err
	}
	if err := s.j.truncate(); err != nil && !errors.Is(err, syscall.EROFS) {
		return err
	}
	return nil
}

// compact settles the journal once it has grown past its compaction point,
// if no other process has the store open. A failure leaves the journal as
// it is, to be replayed or compacted later: the records are durable in it.
func (s *Store) compact() {
	if !s.j.due() {
		return
	}
	s.gate.Lock()
	defer s.gate.Unlock()
	if !s.j.due() {
		return
	}
	alone, err := s.j.tryExclusive()
	if err != nil || !alone {
		s.j.postpone()
		return
	}
	if err := s.settle(); err != nil {
		s.j.postpone()
	}
	// Ignored: a failure to take the shared lock back only lets a second
	// process compact while this one writes, which loses nothing: each of
	// this process's writes is in the journal before its file changes.
	_ = s.j.shared()
}

func tempPrefix(uid types.UID) string { return ".tmp-" + string(uid) + ".json-" }

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

func (s *Store) path(uid types.UID) string {
	return filepath.Join(s.dir, string(uid)+".json")
}

// Get returns the record of uid, nil if there is none, or an error wrapping
// ErrCorrupt that names the file.
func (s *Store) Get(uid types.UID) (*Claim, error) {
	if err := claimuid.Validate(uid); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(s.path(uid))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint of claim %s: %w", uid, err)
	}
	c, err := decode(data)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", s.path(uid), err)
	}
	if c.UID != uid {
		return nil, fmt.Errorf("checkpoint %s: %w: it records claim %s", s.path(uid), ErrCorrupt, c.UID)
	}
	return c, nil
}

// Salvage reads what it can of an unreadable record (a bad checksum, a
// version newer than this build, fields it does not know), without the
// checks Get makes. The result is not to be trusted for anything but
// failing closed: keeping the devices it names reserved, and finding MIG
// instances to double-check before destroying them.
func (s *Store) Salvage(uid types.UID) (*Claim, error) {
	if err := claimuid.Validate(uid); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(s.path(uid))
	if err != nil {
		return nil, err
	}
	return salvage(data)
}

func salvage(data []byte) (*Claim, error) {
	var env envelope
	if err := json.Unmarshal(data, &env); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	var c Claim
	if err := json.Unmarshal(env.Claim, &c); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return &c, nil
}

// Decode decodes one record file's content, with every check Get makes
// but the file name's.
func Decode(data []byte) (*Claim, error) { return decode(data) }

func decode(data []byte) (*Claim, error) {
	var env envelope
	if err := json.Unmarshal(data, &env); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if env.Version < 1 || env.Version > Version {
		return nil, fmt.Errorf("%w: version %d, this build reads 1 to %d", ErrCorrupt, env.Version, Version)
	}
	if sum := checksum(env.Claim); sum != env.Checksum {
		return nil, fmt.Errorf("%w: checksum %s does not match content (%s)", ErrCorrupt, env.Checksum, sum)
	}
	var c Claim
	dec := json.NewDecoder(bytes.NewReader(env.Claim))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return &c, nil
}

// checksum hashes the compact form of a record, so indentation added when
// the envelope is written does not change it.
func checksum(b []byte) string {
	var compact bytes.Buffer
	if err := json.Compact(&compact, b); err == nil {
		b = compact.Bytes()
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Put replaces the record of c.UID atomically and durably: it returns once
// the journal holds the record on disk and the record file holds it. If
// the file cannot be written after the journal entry was, Put fails, and
// the next Open may still restore the new record, as after a crash.
func (s *Store) Put(c *Claim) error {
	if err := claimuid.Validate(c.UID); err != nil {
		return fmt.Errorf("write checkpoint of claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	body, err := json.Marshal(c)
	if err != nil {
		return err
	}
	data, err := json.MarshalIndent(envelope{Version: Version, Checksum: checksum(body), Claim: body}, "", "  ")
	if err != nil {
		return err
	}
	defer s.compact()
	s.gate.RLock()
	defer s.gate.RUnlock()
	if err := s.j.append(frame(opPut, c.UID, data)); err != nil {
		return fmt.Errorf("write checkpoint of claim %s/%s (%s): %w", c.Namespace, c.Name, c.UID, err)
	}
	if err := replace(s.dir, filepath.Base(s.path(c.UID)), tempPrefix(c.UID), data); err != nil {
		return fmt.Errorf("write checkpoint of claim %s/%s (%s): %w", c.Namespace, c.Name, c.UID, err)
	}
	return nil
}

// replace swaps dir/name for data atomically but without an fsync: the
// journal entry before it is what is durable.
func replace(dir, name, tempPrefix string, data []byte) error {
	f, err := os.CreateTemp(dir, tempPrefix+"*")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(0o600)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// Delete removes the record of uid durably; a missing record is not an
// error, and needs no write.
func (s *Store) Delete(uid types.UID) error {
	if err := claimuid.Validate(uid); err != nil {
		return err
	}
	if _, err := os.Lstat(s.path(uid)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	defer s.compact()
	s.gate.RLock()
	defer s.gate.RUnlock()
	if err := s.j.append(frame(opDelete, uid, nil)); err != nil {
		return fmt.Errorf("delete checkpoint of claim %s: %w", uid, err)
	}
	if err := os.Remove(s.path(uid)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete checkpoint of claim %s: %w", uid, err)
	}
	return nil
}

// List loads every record. Records that cannot be read are returned in
// corrupt, keyed by the claim UID of their file name, and do not stop the
// others from loading. Leftover temp files from a crash are removed.
func (s *Store) List() (claims []*Claim, corrupt map[types.UID]error, err error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, nil, fmt.Errorf("list checkpoints: %w", err)
	}
	corrupt = map[types.UID]error{}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".tmp-") {
			os.Remove(filepath.Join(s.dir, name))
			continue
		}
		uid, ok := strings.CutSuffix(name, ".json")
		if !ok || e.IsDir() || claimuid.Validate(types.UID(uid)) != nil {
			continue
		}
		c, err := s.Get(types.UID(uid))
		if err != nil {
			corrupt[types.UID(uid)] = err
			continue
		}
		claims = append(claims, c)
	}
	return claims, corrupt, nil
}

// Usage is the records' total size in bytes and their number, readable or
// not, from the directory listing alone (no record is read or parsed, so a
// metrics scrape costs one readdir and a stat per record). Temp files are
// not counted.
func (s *Store) Usage() (bytes int64, records int, err error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return 0, 0, fmt.Errorf("list checkpoints: %w", err)
	}
	for _, e := range entries {
		uid, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || e.IsDir() || claimuid.Validate(types.UID(uid)) != nil {
			continue
		}
		info, err := e.Info()
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted since the listing
		}
		if err != nil {
			return 0, 0, fmt.Errorf("checkpoint %s: %w", e.Name(), err)
		}
		bytes += info.Size()
		records++
	}
	return bytes, records, nil
}
