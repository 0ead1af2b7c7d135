// Package checkpoint records which ResourceClaims the plugin has prepared,
// so that prepare and unprepare stay idempotent across plugin restarts,
// upgrades and reboots.
//
// A record is written once, to a journal with group commit (see
// journal.go): concurrent writes share one write and one fdatasync, and no
// file is created per claim while the plugin runs. The journal is the
// record until it is compacted (past 8 MiB, at Close and at the next
// Open): then each claim's latest record goes to a file of its own,
// <dir>/<claimUID>.json, holding a version, a SHA-256 checksum and the
// record, written atomically (temp file, rename) and fsynced. Because
// records are separate, a corrupt file or journal entry fails only its own
// claim: the others load, and the plugin starts.
package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/types"

	"github.com/facet-gpu/facet/pkg/node/claimuid"

	"github.com/facet-gpu/facet/pkg/model/atomicfile"
)

// Version is the record format written by this build. Older versions are
// read and upgraded in place on the next write.
//
// A newer format is read too, for a rollback to this build, when the
// record says this build may (MinReader): its writer added only fields
// that a reader may ignore, and this build ignores them. A build that
// changes what a record means, or adds a field that unpreparing needs (a
// new resource to free), writes a MinReader above the formats that cannot
// honour it; those refuse the record rather than misread it, as corrupt,
// which fails closed (its devices stay reserved, its claim fails with the
// reason). So every rollback to the previous minor version reads the
// records of the next one, unless the next one's release notes say it
// raised MinReader.
//
// Format 2 adds Claim.ComputeDomain, the domain of an IMEX channel claim.
const Version = 2

// MinReader is the oldest format that may read a record this build writes
// without a ComputeDomain: 1, since format 2 adds nothing else, and a
// format-1 reader that ignores the (absent) field reads such a record
// right. So a rollback to a format-1 build reads every GPU claim.
const MinReader = 1

// MinReaderComputeDomain is the oldest format that may read a record with
// a ComputeDomain: 2. Unpreparing an IMEX channel claim removes the node's
// compute-domain label once no claim of the domain is left; a format-1
// build, which does not know the field, would unprepare the claim and
// leave the label, so the domain's IMEX daemon would stay on the node.
// It refuses the record instead, as corrupt (fail closed).
const MinReaderComputeDomain = 2

// minReaderOf is the MinReader a record is written with.
func minReaderOf(c *Claim) int {
	if c.ComputeDomain != nil {
		return MinReaderComputeDomain
	}
	return MinReader
}

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
	// MPSUser is the Unix UID the claim's pods run as, set when its shares
	// are MPS-partitioned (Share.MPS): its GPU's daemon serves one UID.
	// Nil in such records of earlier versions (any UID).
	MPSUser *int64 `json:"mpsUser,omitempty"`
	// Pods are the names of the pods the claim was reserved for
	// (status.reservedFor, resource pods) at its latest prepare: the
	// kubelet prepares a claim again for each pod that joins it on the
	// node, and that prepare updates them. For the per-claim metrics'
	// pod label; empty in records of earlier versions.
	Pods []string `json:"pods,omitempty"`
	// ComputeDomain is the domain of an IMEX channel claim (its device of
	// kind imex-channel): while any record names it, the node carries the
	// domain's label. Nil for other claims. Format 2.
	ComputeDomain *ComputeDomain `json:"computeDomain,omitempty"`
}

// ComputeDomain records the ComputeDomain an IMEX channel claim joins, as
// its ComputeDomainChannelConfig named it and prepare found it.
type ComputeDomain struct {
	// UID is the domain's metadata.uid, the node label's value.
	UID string `json:"uid"`
	// Namespace and Name are the domain's, the claim's namespace.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// FromOtherBoot tells whether the record was written before the last
// reboot: its BootID and bootID, this boot's, both known and different.
// A record without one (earlier versions), or a node whose boot ID is
// unknown (""), is not judged: its claim is verified on re-prepare instead.
func (c *Claim) FromOtherBoot(bootID string) bool {
	return c.BootID != "" && bootID != "" && c.BootID != bootID
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
	// Kind is "gpu" (a whole GPU), "mig", "mig-static", "share" (a vGPU
	// share), "slot" or "imex-channel" (no GPU: GPUUUID is empty).
	Kind string `json:"kind"`
	// MIG is set for a MIG device.
	MIG *MIG `json:"mig,omitempty"`
	// Share is set for a vGPU share.
	Share *Share `json:"share,omitempty"`
}

// MIG records a MIG device's intent (profile and placement, written before
// any NVML call) and, once created, its instance IDs.
type MIG struct {
	Profile string `json:"profile"`
	// GIProfileID is NVML's GPU instance profile index
	// (nvml.MIGProfile.GIProfileID, 0 for a 1g.10gb), what CreateMIG takes.
	GIProfileID int `json:"giProfileID"`
	// GIProfileInfoID is the profile's ID as nvidia-smi shows it
	// (nvml.MIGProfile.GIProfileInfoID, 19 for a 1g.10gb), for people
	// reading the record; nothing Facet does depends on it. Nil in records
	// written before it existed.
	//
	// It is an optional field of format 1 rather than a new format: no
	// release has written format 1 without it (0.1.0 is the first release
	// with a checkpoint, docs/release-notes.md), so every release that
	// reads format 1 knows it, and a rollback of one minor version reads
	// it. Only a development build from before it refuses a record with
	// it, as one with an unknown field.
	GIProfileInfoID *int `json:"giProfileInfoID,omitempty"`
	CIProfileID     int  `json:"ciProfileID"`
	Start           int  `json:"start"`
	Size            int  `json:"size"`
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
	// MPS is set for a share partitioned by its GPU's MPS control daemon
	// (package mps): the claim holds that daemon, which runs while any
	// claim does. False: HAMi-core time-slices it.
	MPS bool `json:"mps,omitempty"`
}

// ErrCorrupt marks a record that cannot be trusted.
var ErrCorrupt = errors.New("corrupt checkpoint")

type envelope struct {
	Version int `json:"version"`
	// MinReader is the oldest format that may read the record; 0 (records
	// of builds before it existed): Version.
	MinReader int             `json:"minReader,omitempty"`
	Checksum  string          `json:"checksum"`
	Claim     json.RawMessage `json:"claim"`
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

	// mu guards overlay and seen.
	mu sync.Mutex
	// overlay holds each claim whose latest journal entry its record file
	// does not hold yet: the record's bytes, or nil for a deleted claim.
	// Compaction writes the files and empties it.
	overlay map[types.UID][]byte
	// seen is how far into the journal overlay reflects. Entries past it
	// are another process's, during a rolling upgrade (or this one's,
	// already applied); catchUp reads them.
	seen int64
	// damage describes journal ranges that failed their checksums with
	// no claim UID left to blame, found by this process or kept from
	// earlier ones (journal.wal.damaged-* files).
	damage map[string]error
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
	s := &Store{dir: dir, j: j, overlay: map[types.UID][]byte{}, damage: map[string]error{}}
	// A batch of this process's own that directly follows what overlay
	// reflects needs no reading back: its Puts and Deletes set overlay
	// themselves once it is durable.
	j.wrote = func(off, n int64) {
		s.mu.Lock()
		if s.seen == off {
			s.seen = off + n
		}
		s.mu.Unlock()
	}
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

// Peek reads the record of uid in the store at dir as an open store would
// (its journal's entries over its record file), without opening it: no
// lock, no replay, nothing written, so a running plugin is not disturbed.
// It is for tools and tests; it returns nil if there is no record.
func Peek(dir string, uid types.UID) (*Claim, error) {
	s := &Store{dir: dir, j: &journal{path: filepath.Join(dir, journalName)}, overlay: map[types.UID][]byte{}, damage: map[string]error{}}
	return s.Get(uid)
}

// Close writes the journal's records to their files if no other process
// has the store open (so the next Open has nothing to replay), then
// releases the store's lock on its directory. The store must not be used
// after. A failed compaction loses nothing: the journal still holds the
// records, and the next Open replays it.
func (s *Store) Close() error {
	s.gate.Lock()
	if alone, err := s.j.tryExclusive(); err == nil && alone {
		_ = s.settle()
	}
	s.gate.Unlock()
	return s.j.close()
}

// settle makes every record file the journal names match the journal's
// last entry for it, durably, then empties the journal. It needs the
// directory's flock exclusively.
func (s *Store) settle() error {
	data, err := s.j.readAll()
	if err != nil || len(data) == 0 {
		s.resetOverlay()
		return err
	}
	entries, damaged, _ := parseJournal(data)
	if len(damaged) > 0 {
		// Kept for the operator, and reported by every List until it is
		// removed: the records it held are unknown.
		keep := fmt.Sprintf("%s.damaged-%d", journalName, time.Now().UnixNano())
		if err := atomicfile.Write(s.dir, keep, ".tmp-"+keep+"-", data, 0o600); err != nil {
			return fmt.Errorf("keep the damaged checkpoint journal: %w", err)
		}
	}
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
	s.resetOverlay()
	return nil
}

// resetOverlay forgets the overlay once the record files hold what the
// journal held. Damage found in the journal is forgotten too: its offsets
// are gone with it, and the copy settle kept reports it from now on.
func (s *Store) resetOverlay() {
	s.mu.Lock()
	s.overlay, s.seen, s.damage = map[types.UID][]byte{}, 0, map[string]error{}
	s.mu.Unlock()
}

// catchUp applies the journal entries past seen to the overlay: those of
// another process sharing the directory, and this one's own again (in
// journal order, which ends in the same state). It reads only up to the
// journal's size when it starts, and stops before a frame still being
// written.
func (s *Store) catchUp() error {
	st, err := os.Stat(s.j.path)
	var size int64
	switch {
	case err == nil:
		size = st.Size()
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("checkpoint journal: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if size < s.seen {
		// Compacted by another process: the files hold everything, and
		// what the journal holds now is newer.
		s.overlay, s.seen = map[types.UID][]byte{}, 0
	}
	if size == s.seen {
		return nil
	}
	f, err := os.Open(s.j.path)
	if err != nil {
		return fmt.Errorf("checkpoint journal: %w", err)
	}
	defer f.Close()
	buf := make([]byte, size-s.seen)
	if _, err := f.ReadAt(buf, s.seen); err != nil {
		return fmt.Errorf("checkpoint journal %s: %w", s.j.path, err)
	}
	entries, damaged, end := parseJournal(buf)
	for _, e := range entries {
		if claimuid.Validate(e.uid) != nil {
			continue
		}
		if e.op == opDelete {
			s.overlay[e.uid] = nil
		} else {
			s.overlay[e.uid] = e.data
		}
	}
	for _, d := range damaged {
		s.damage[fmt.Sprintf("%s@%d", journalName, s.seen+int64(d.from))] = fmt.Errorf("%w: checkpoint journal %s: bytes %d to %d fail their checksum; the records they held are unknown",
			ErrCorrupt, s.j.path, s.seen+int64(d.from), s.seen+int64(d.to))
	}
	s.seen += int64(end)
	return nil
}

// lookup returns what the overlay holds for uid: in says whether it holds
// anything, and data is nil for a deleted claim.
func (s *Store) lookup(uid types.UID) (data []byte, in bool, err error) {
	if err := s.catchUp(); err != nil {
		return nil, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	data, in = s.overlay[uid]
	return data, in, nil
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
	data, in, err := s.lookup(uid)
	if err != nil {
		return nil, fmt.Errorf("read checkpoint of claim %s: %w", uid, err)
	}
	if in {
		if data == nil {
			return nil, nil
		}
		return s.decodeAs(uid, data, "checkpoint journal "+s.j.path+" entry of claim "+string(uid))
	}
	return s.getFile(uid)
}

// getFile reads uid's record file.
func (s *Store) getFile(uid types.UID) (*Claim, error) {
	data, err := os.ReadFile(s.path(uid))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint of claim %s: %w", uid, err)
	}
	return s.decodeAs(uid, data, "checkpoint "+s.path(uid))
}

// decodeAs decodes the record of uid from where (for errors).
func (s *Store) decodeAs(uid types.UID, data []byte, where string) (*Claim, error) {
	c, err := decode(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if c.UID != uid {
		return nil, fmt.Errorf("%s: %w: it records claim %s", where, ErrCorrupt, c.UID)
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
	data, in, err := s.lookup(uid)
	if err != nil {
		return nil, err
	}
	if in {
		if data == nil {
			return nil, fmt.Errorf("checkpoint of claim %s: %w", uid, os.ErrNotExist)
		}
		return salvage(data)
	}
	data, err = os.ReadFile(s.path(uid))
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
	minReader := env.MinReader
	if minReader == 0 {
		minReader = env.Version
	}
	switch {
	case env.Version < 1 || minReader < 1 || minReader > env.Version:
		return nil, fmt.Errorf("%w: version %d, minReader %d", ErrCorrupt, env.Version, env.MinReader)
	case minReader > Version:
		return nil, fmt.Errorf("%w: version %d, written by a newer Facet that says formats before %d cannot read it, and this build reads 1 to %d: roll forward to read it", ErrCorrupt, env.Version, minReader, Version)
	}
	if sum := checksum(env.Claim); sum != env.Checksum {
		return nil, fmt.Errorf("%w: checksum %s does not match content (%s)", ErrCorrupt, env.Checksum, sum)
	}
	var c Claim
	dec := json.NewDecoder(bytes.NewReader(env.Claim))
	if env.Version <= Version {
		// A field this format does not have, in a record of this
		// format or an older one, is damage. A newer writer's fields
		// are ignored (see Version).
		dec.DisallowUnknownFields()
	}
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
// the journal holds the record on disk. Its file is written at the next
// compaction, or at once (without an fsync) while another process has the
// directory open.
func (s *Store) Put(c *Claim) error {
	if err := claimuid.Validate(c.UID); err != nil {
		return fmt.Errorf("write checkpoint of claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	body, err := json.Marshal(c)
	if err != nil {
		return err
	}
	data, err := json.MarshalIndent(envelope{Version: Version, MinReader: minReaderOf(c), Checksum: checksum(body), Claim: body}, "", "  ")
	if err != nil {
		return err
	}
	defer s.compact()
	s.gate.RLock()
	defer s.gate.RUnlock()
	if err := s.j.append(frame(opPut, c.UID, data)); err != nil {
		return fmt.Errorf("write checkpoint of claim %s/%s (%s): %w", c.Namespace, c.Name, c.UID, err)
	}
	s.mu.Lock()
	s.overlay[c.UID] = data
	s.mu.Unlock()
	if !s.j.alone() {
		// Another plugin process has the directory open: a rolling
		// update, perhaps from a release that reads only record files.
		// Keep this claim's file current for it too.
		if err := replace(s.dir, filepath.Base(s.path(c.UID)), tempPrefix(c.UID), data); err != nil {
			return fmt.Errorf("write checkpoint of claim %s/%s (%s): %w", c.Namespace, c.Name, c.UID, err)
		}
	}
	return nil
}

// replace swaps dir/name for data atomically but without an fsync: the
// journal entry before it is what is durable.
func replace(dir, name, tempPrefix string, data []byte) error {
	return atomicfile.WriteWith(dir, name, data, atomicfile.Options{TempPattern: tempPrefix + "*", Perm: 0o600, NoSync: true})
}

// Delete removes the record of uid durably; a missing record is not an
// error, and needs no write.
func (s *Store) Delete(uid types.UID) error {
	if err := claimuid.Validate(uid); err != nil {
		return err
	}
	data, in, err := s.lookup(uid)
	if err != nil {
		return fmt.Errorf("delete checkpoint of claim %s: %w", uid, err)
	}
	if in && data == nil {
		return nil
	}
	if !in {
		if _, err := os.Lstat(s.path(uid)); errors.Is(err, os.ErrNotExist) {
			return nil
		}
	}
	defer s.compact()
	s.gate.RLock()
	defer s.gate.RUnlock()
	if err := s.j.append(frame(opDelete, uid, nil)); err != nil {
		return fmt.Errorf("delete checkpoint of claim %s: %w", uid, err)
	}
	s.mu.Lock()
	s.overlay[uid] = nil
	s.mu.Unlock()
	if !s.j.alone() {
		// See Put: a file-reading process may share the directory.
		if err := os.Remove(s.path(uid)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("delete checkpoint of claim %s: %w", uid, err)
		}
	}
	return nil
}

// List loads every record. Records that cannot be read are returned in
// corrupt, keyed by the claim UID of their file name, and do not stop the
// others from loading. Leftover temp files from a crash are removed.
//
// Journal damage that names no claim (and a kept damaged journal,
// journal.wal.damaged-*) is in corrupt too, under a key that is not a
// valid claim UID ("journal.wal@<offset>", or the kept file's name):
// Salvage refuses it, so the caller treats the devices as unknown.
func (s *Store) List() (claims []*Claim, corrupt map[types.UID]error, err error) {
	return s.list(true)
}

// PeekAll lists the records of the store at dir as List does (journal
// entries over record files, unreadable ones in corrupt), without opening
// it: no lock, no replay, and no leftover temp file removed, so a running
// plugin is not disturbed. A missing dir holds no record. It is for tools
// (node-check picking an idle GPU, node-cleanup refusing while claims are
// prepared).
func PeekAll(dir string) (claims []*Claim, corrupt map[types.UID]error, err error) {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil, map[types.UID]error{}, nil
	}
	s := &Store{dir: dir, j: &journal{path: filepath.Join(dir, journalName)}, overlay: map[types.UID][]byte{}, damage: map[string]error{}}
	return s.list(false)
}

// list is List; tidy removes the temp files a crash left.
func (s *Store) list(tidy bool) (claims []*Claim, corrupt map[types.UID]error, err error) {
	if err := s.catchUp(); err != nil {
		return nil, nil, err
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, nil, fmt.Errorf("list checkpoints: %w", err)
	}
	s.mu.Lock()
	overlay := maps.Clone(s.overlay)
	corrupt = map[types.UID]error{}
	for k, err := range s.damage {
		corrupt[types.UID(k)] = err
	}
	s.mu.Unlock()
	add := func(uid types.UID, c *Claim, err error) {
		switch {
		case err != nil:
			corrupt[uid] = err
		case c != nil:
			claims = append(claims, c)
		}
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".tmp-") {
			if tidy {
				os.Remove(filepath.Join(s.dir, name))
			}
			continue
		}
		if strings.HasPrefix(name, journalName+".damaged-") {
			corrupt[types.UID(name)] = fmt.Errorf("%w: %s is a checkpoint journal kept because part of it failed its checksums; the records it held may be unknown (remove it once the node's claims are checked)", ErrCorrupt, filepath.Join(s.dir, name))
			continue
		}
		uid, ok := strings.CutSuffix(name, ".json")
		if !ok || e.IsDir() || claimuid.Validate(types.UID(uid)) != nil {
			continue
		}
		if _, in := overlay[types.UID(uid)]; in {
			continue
		}
		c, err := s.getFile(types.UID(uid))
		add(types.UID(uid), c, err)
	}
	for uid, data := range overlay {
		if data != nil {
			c, err := s.decodeAs(uid, data, "checkpoint journal "+s.j.path+" entry of claim "+string(uid))
			add(uid, c, err)
		}
	}
	return claims, corrupt, nil
}

// Usage is the records' total size in bytes and their number, readable or
// not: those in the journal not yet compacted, and the record files (from
// the directory listing: no file is read or parsed, so a metrics scrape
// costs the journal's new entries, one readdir and a stat per file). Temp
// files are not counted.
func (s *Store) Usage() (bytes int64, records int, err error) {
	if err := s.catchUp(); err != nil {
		return 0, 0, err
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return 0, 0, fmt.Errorf("list checkpoints: %w", err)
	}
	s.mu.Lock()
	overlay := maps.Clone(s.overlay)
	s.mu.Unlock()
	for _, data := range overlay {
		if data != nil {
			bytes += int64(len(data))
			records++
		}
	}
	for _, e := range entries {
		uid, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || e.IsDir() || claimuid.Validate(types.UID(uid)) != nil {
			continue
		}
		if _, in := overlay[types.UID(uid)]; in {
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
