package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/facet-gpu/facet/pkg/model/atomicfile"
	"github.com/facet-gpu/facet/pkg/node/claimuid"
)

// The journal is what makes a Put or Delete durable. Every change is first
// appended to <dir>/journal.wal, and concurrent changes share one write and
// one fdatasync (group commit): a Put returns only once the batch holding
// its entry is on disk. The record file itself is then replaced without an
// fsync of its own (temp file and rename, so it is atomic, and after a
// plugin crash the page cache still holds it).
//
// Only a power loss or a kernel crash can lose a record file written so.
// The next Open replays the journal: for each claim it named, the file is
// made to match the journal's last entry and fsynced. The journal is then
// truncated. The same happens when the journal grows past compactBytes,
// so the journal stays small.
//
// Two plugin processes may share the directory during a rolling upgrade.
// Each holds a shared flock on the journal while it is open; replay and
// compaction need an exclusive one, and are skipped while another process
// holds the journal. Skipping is safe: a running process means no power
// was lost, so the record files are up to date.

// journalName is the journal's file name in the store's directory.
const journalName = "journal.wal"

// compactBytes is the journal size past which it is compacted: about 8,000
// record writes. Compaction stalls writes while it fsyncs the live records
// (not the journal's history), so its cost is the same whatever the size;
// only a replay at start reads the whole journal.
const compactBytes = 8 << 20

const (
	opPut    = 'P'
	opDelete = 'D'
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

type journal struct {
	// lock is the store's directory, flocked shared while the store is
	// open and exclusively to replay or compact.
	lock *os.File
	path string

	mu       sync.Mutex
	cond     *sync.Cond
	pending  []byte
	next     *batch
	flushing bool
	// size is the journal's length after this process's last write, and
	// compactAt the size past which it is compacted.
	size, compactAt int64
	// limit is how far the journal grows between compactions
	// (compactBytes; tests set less).
	limit int64
	// broken is set when a failed fdatasync left the journal's state on
	// disk unknown: every later change fails until a restart replays it.
	broken error
	// queued is how many entries pending holds, and syncs how many
	// fdatasyncs were made, for tests.
	queued, syncs int
	// beforeSync, if set, runs before each batch's write (tests).
	beforeSync func()
	// wrote, if set, is told where each durable batch landed: its offset
	// and length. It runs before the batch's appends return.
	wrote func(off, n int64)
}

type batch struct {
	done bool
	err  error
}

// frame encodes one journal entry: its payload's length and CRC-32C, then
// the operation, the claim UID's length and the UID, then for a Put the
// record file's content.
func frame(op byte, uid types.UID, data []byte) []byte {
	payload := make([]byte, 0, 3+len(uid)+len(data))
	payload = append(payload, op)
	payload = binary.BigEndian.AppendUint16(payload, uint16(len(uid)))
	payload = append(payload, uid...)
	payload = append(payload, data...)
	out := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint32(out[0:4], uint32(len(payload)))
	binary.BigEndian.PutUint32(out[4:8], crc32.Checksum(payload, crcTable))
	return append(out, payload...)
}

type entry struct {
	op   byte
	uid  types.UID
	data []byte
	// off is where the entry's frame begins in the journal.
	off int
}

// span is a range of the journal, [from, to), that holds no valid frame.
type span struct{ from, to int }

// parseJournal decodes the journal's frames. A frame that is short or
// fails its checksum is either the tail of a batch that a crash or a
// write in progress left (nothing valid follows it: parsing ends there,
// and end is its offset) or damage in the middle (bit rot; a valid frame
// follows). Damage is skipped up to the next valid frame and reported in
// damaged; where the damaged frame's header still names a valid claim UID,
// it is also returned as a Put of its damaged bytes, so that the claim's
// record reads as corrupt (fail closed) rather than as an older version.
func parseJournal(b []byte) (entries []entry, damaged []span, end int) {
	off := 0
	for off < len(b) {
		if e, n, ok := parseFrame(b[off:]); ok {
			e.off = off
			entries = append(entries, e)
			off += n
			continue
		}
		next := -1
		for o := off + 1; o+8 <= len(b); o++ {
			if _, _, ok := parseFrame(b[o:]); ok {
				next = o
				break
			}
		}
		if next < 0 {
			return entries, damaged, off
		}
		damaged = append(damaged, span{off, next})
		if uid, data, ok := damagedUID(b[off:next]); ok {
			entries = append(entries, entry{op: opPut, uid: uid, data: data, off: off})
		}
		off = next
	}
	return entries, damaged, off
}

// parseFrame decodes the frame at the start of b, and its length.
func parseFrame(b []byte) (entry, int, bool) {
	if len(b) < 8 {
		return entry{}, 0, false
	}
	n := binary.BigEndian.Uint32(b[0:4])
	if uint64(n) > uint64(len(b)-8) || n < 3 {
		return entry{}, 0, false
	}
	payload := b[8 : 8+n]
	if crc32.Checksum(payload, crcTable) != binary.BigEndian.Uint32(b[4:8]) {
		return entry{}, 0, false
	}
	if payload[0] != opPut && payload[0] != opDelete {
		return entry{}, 0, false
	}
	ulen := int(binary.BigEndian.Uint16(payload[1:3]))
	if 3+ulen > len(payload) {
		return entry{}, 0, false
	}
	return entry{op: payload[0], uid: types.UID(payload[3 : 3+ulen]), data: payload[3+ulen:]}, 8 + int(n), true
}

// damagedUID reads the claim UID and record bytes of a damaged frame whose
// header still holds together.
func damagedUID(b []byte) (types.UID, []byte, bool) {
	if len(b) < 11 {
		return "", nil, false
	}
	n := int(binary.BigEndian.Uint32(b[0:4]))
	if n < 3 || n > len(b)-8 {
		return "", nil, false
	}
	payload := b[8 : 8+n]
	ulen := int(binary.BigEndian.Uint16(payload[1:3]))
	if 3+ulen > len(payload) {
		return "", nil, false
	}
	uid := types.UID(payload[3 : 3+ulen])
	if claimuid.Validate(uid) != nil {
		return "", nil, false
	}
	data := payload[3+ulen:]
	if len(data) == 0 {
		// A damaged Delete, or a Put with nothing left: still not to
		// be read as the older record.
		data = []byte("damaged")
	}
	return uid, data, true
}

func openJournal(dir string) (*journal, error) {
	// The lock is on the directory, which can be opened even where it is
	// read-only; the journal file is opened for each batch, so that no
	// file is held open for writing (a remount read-only would fail).
	d, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("open checkpoint directory: %w", err)
	}
	j := &journal{lock: d, path: filepath.Join(dir, journalName), limit: compactBytes}
	j.cond = sync.NewCond(&j.mu)
	return j, nil
}

func (j *journal) close() error { return j.lock.Close() }

// append adds one entry and returns once it is durable, sharing the write
// and the fdatasync with whatever other entries are queued meanwhile.
func (j *journal) append(fr []byte) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.broken != nil {
		return j.broken
	}
	if j.next == nil {
		j.next = &batch{}
	}
	b := j.next
	j.pending = append(j.pending, fr...)
	j.queued++
	// b is queued (j.next), being flushed, or done. Whoever finds no flush
	// in progress flushes the queue; the others wait for it.
	for !b.done {
		if j.flushing {
			j.cond.Wait()
			continue
		}
		j.flushing = true
		data, cur := j.pending, j.next
		j.pending, j.next, j.queued = nil, nil, 0
		j.mu.Unlock()
		err := j.write(data)
		j.mu.Lock()
		cur.done, cur.err = true, err
		j.flushing = false
		j.cond.Broadcast()
	}
	return b.err
}

// write appends data to the journal and fdatasyncs it. It runs with j.mu
// unlocked, one at a time (j.flushing).
func (j *journal) write(data []byte) (err error) {
	if j.beforeSync != nil {
		j.beforeSync()
	}
	created := false
	f, err := os.OpenFile(j.path, os.O_WRONLY|os.O_APPEND, 0)
	if errors.Is(err, os.ErrNotExist) {
		f, err = os.OpenFile(j.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		created = true
	}
	if err != nil {
		return fmt.Errorf("checkpoint journal: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("checkpoint journal %s: %w", j.path, cerr)
		}
	}()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("checkpoint journal %s: %w", j.path, err)
	}
	if _, err := f.Write(data); err != nil {
		// A short write (a full disk) would leave a torn frame that hides
		// every later one from replay: cut it off.
		if terr := f.Truncate(st.Size()); terr != nil {
			j.setBroken(fmt.Errorf("checkpoint journal %s: %w, and cutting off the partial write failed: %v", j.path, err, terr))
		}
		return fmt.Errorf("checkpoint journal %s: %w", j.path, err)
	}
	j.mu.Lock()
	j.syncs++
	j.mu.Unlock()
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		// After a failed fsync the kernel may have dropped the dirty
		// pages: nothing written since can be trusted to be on disk.
		err = fmt.Errorf("checkpoint journal %s: fdatasync: %w", j.path, err)
		j.setBroken(err)
		return err
	}
	if created {
		if err := atomicfile.SyncDir(filepath.Dir(j.path)); err != nil {
			return fmt.Errorf("checkpoint journal %s: %w", j.path, err)
		}
	}
	j.mu.Lock()
	j.size = st.Size() + int64(len(data))
	j.mu.Unlock()
	if j.wrote != nil {
		j.wrote(st.Size(), int64(len(data)))
	}
	return nil
}

func (j *journal) setBroken(err error) {
	j.mu.Lock()
	j.broken = err
	j.mu.Unlock()
}

// due says whether the journal has grown past the next compaction point.
func (j *journal) due() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.size > j.compactAt
}

// postpone moves the next compaction point a limit further on.
func (j *journal) postpone() {
	j.mu.Lock()
	j.compactAt = j.size + j.limit
	j.mu.Unlock()
}

// tryExclusive takes the directory's flock exclusively if no other
// process holds it, else returns false, holding the shared lock (again).
func (j *journal) tryExclusive() (bool, error) {
	// Converting a held lock drops it first, so a failed attempt must
	// take the shared lock back.
	err := unix.Flock(int(j.lock.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, unix.EWOULDBLOCK) {
		return false, fmt.Errorf("lock checkpoint directory: %w", err)
	}
	return false, j.shared()
}

// alone says whether no other process has the directory open right now.
// It takes the flock exclusively for a moment, so it costs two flock
// calls; it is false if the probe itself fails.
func (j *journal) alone() bool {
	ok, err := j.tryExclusive()
	if err != nil || !ok {
		return false
	}
	return j.shared() == nil
}

func (j *journal) shared() error {
	if err := unix.Flock(int(j.lock.Fd()), unix.LOCK_SH); err != nil {
		return fmt.Errorf("lock checkpoint directory: %w", err)
	}
	return nil
}

// readAll reads the whole journal, whatever any process appended; none
// is empty.
func (j *journal) readAll() ([]byte, error) {
	data, err := os.ReadFile(j.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return data, err
}

// truncate empties the journal durably.
func (j *journal) truncate() error {
	f, err := os.OpenFile(j.path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(0); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	j.mu.Lock()
	j.size, j.compactAt = 0, j.limit
	j.mu.Unlock()
	return nil
}
