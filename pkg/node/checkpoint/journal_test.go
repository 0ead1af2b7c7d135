package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// TestGroupCommit: concurrent Puts share fdatasyncs. The first batch's
// sync is held until every Put is queued, so the rest must go in one more.
func TestGroupCommit(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 32
	var queued sync.WaitGroup
	queued.Add(n)
	first := true
	s.j.beforeSync = func() {
		if first {
			first = false
			queued.Wait()
			// Every Put has called append by now, but may not yet hold
			// the journal's mutex: let them reach it.
			for s.pendingFrames() < n-1 {
				runtime.Gosched()
			}
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			queued.Done()
			errs <- s.Put(claim(fmt.Sprintf("c%d", i)))
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if s.j.syncs > 2 {
		t.Errorf("%d Puts took %d fdatasyncs, want at most 2", n, s.j.syncs)
	}
	for i := range n {
		if c, err := s.Get(types.UID(fmt.Sprintf("c%d", i))); err != nil || c == nil {
			t.Fatalf("c%d: %v %v", i, c, err)
		}
	}
}

// crash stops a store as a killed process does: its lock goes, nothing is
// compacted.
func crash(s *Store) { s.j.close() }

// TestReplayAfterPowerLoss: the records a crash left only in the journal
// are there at the next Open, over stale or damaged files a power loss
// left; deletes are redone, the files are written, and the journal is
// emptied.
func TestReplayAfterPowerLoss(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	a, b, gone := claim("a"), claim("b"), claim("gone")
	for _, c := range []*Claim{b, gone} {
		if err := s.Put(c); err != nil {
			t.Fatal(err)
		}
	}
	s.Close() // b.json and gone.json are written
	s, _ = Open(dir)
	if err := s.Put(a); err != nil {
		t.Fatal(err)
	}
	b.State = StatePreparing
	if err := s.Put(b); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("gone"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "a.json")); !os.IsNotExist(err) {
		t.Fatalf("a record file written before compaction: %v", err)
	}
	crash(s)
	// And the power loss damaged b's older file.
	if err := os.WriteFile(filepath.Join(dir, "b.json"), []byte{}, 0o600); err != nil {
		t.Fatal(err)
	}

	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	claims, corrupt, err := s.List()
	if err != nil || len(corrupt) != 0 {
		t.Fatalf("List: %v %v", corrupt, err)
	}
	got := map[types.UID]*Claim{}
	for _, c := range claims {
		got[c.UID] = c
	}
	if want := map[types.UID]*Claim{"a": a, "b": b}; !reflect.DeepEqual(got, want) {
		t.Fatalf("after replay: %+v, want %+v", got, want)
	}
	if st, err := os.Stat(filepath.Join(dir, journalName)); err != nil || st.Size() != 0 {
		t.Fatalf("journal not emptied: %v %v", st, err)
	}
	for name, want := range map[string]bool{"a.json": true, "b.json": true, "gone.json": false} {
		if _, err := os.Stat(filepath.Join(dir, name)); (err == nil) != want {
			t.Errorf("%s: exists %v, want %v", name, err == nil, want)
		}
	}
}

// TestTornJournalTail: a batch a crash cut short is ignored; the entries
// before it are replayed.
func TestTornJournalTail(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	if err := s.Put(claim("a")); err != nil {
		t.Fatal(err)
	}
	crash(s)
	torn := frame(opPut, "b", []byte("{}"))
	f, err := os.OpenFile(filepath.Join(dir, journalName), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(torn[:len(torn)-1]); err != nil {
		t.Fatal(err)
	}
	f.Close()
	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if c, err := s.Get("a"); err != nil || c == nil {
		t.Fatalf("a not replayed: %v %v", c, err)
	}
	if c, err := s.Get("b"); err != nil || c != nil {
		t.Fatalf("torn entry applied: %v %v", c, err)
	}
}

// TestCompaction: past compactBytes the journal is emptied, the records
// stay, and while another process (here: another Store) has the directory
// open, nothing is compacted.
func TestCompaction(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	defer s.Close()
	const limit = 16 << 10
	s.j.limit, s.j.compactAt = limit, limit
	other, _ := Open(dir)
	put := func(n int) {
		for i := range n {
			if err := s.Put(claim(fmt.Sprintf("c%d", i%50))); err != nil {
				t.Fatal(err)
			}
		}
	}
	put(100)
	if st, _ := os.Stat(filepath.Join(dir, journalName)); st.Size() <= limit {
		t.Fatalf("journal compacted (%d bytes) while another store had the directory open", st.Size())
	}
	other.Close()
	put(100)
	if st, _ := os.Stat(filepath.Join(dir, journalName)); st.Size() > limit {
		t.Fatalf("journal not compacted: %d bytes", st.Size())
	}
	claims, corrupt, err := s.List()
	if err != nil || len(claims) != 50 || len(corrupt) != 0 {
		t.Fatalf("List: %d records, %v %v", len(claims), corrupt, err)
	}
}

// TestSecondStoreSeesWrites: two stores on one directory (two plugin
// processes during a rolling upgrade) read each other's records at once.
func TestSecondStoreSeesWrites(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	defer s.Close()
	other, _ := Open(dir)
	defer other.Close()
	if err := s.Put(claim("a")); err != nil {
		t.Fatal(err)
	}
	if c, err := other.Get("a"); err != nil || c == nil {
		t.Fatalf("other store: %v %v", c, err)
	}
	if err := other.Delete("a"); err != nil {
		t.Fatal(err)
	}
	if c, err := s.Get("a"); err != nil || c != nil {
		t.Fatalf("deleted by the other store, still here: %v %v", c, err)
	}
	// While two processes share the directory, record files stay current
	// for a release that reads only them (rolling update from before the
	// journal was the record).
	if err := s.Put(claim("b")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "b.json")); err != nil {
		t.Fatalf("record file not written while shared: %v", err)
	}
	if err := other.Delete("b"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "b.json")); !os.IsNotExist(err) {
		t.Fatalf("record file not removed while shared: %v", err)
	}
}

func FuzzParseJournal(f *testing.F) {
	f.Add(frame(opPut, "a", []byte(`{"x":1}`)))
	f.Add(append(frame(opDelete, "a", nil), 0, 0, 0))
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 0, 'P'})
	f.Add(append(append(frame(opPut, "a", []byte("x")), 1, 2, 3), frame(opDelete, "b", nil)...))
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, damaged, end := parseJournal(data)
		if end > len(data) {
			t.Fatalf("end %d past the journal's %d bytes", end, len(data))
		}
		// Each valid entry re-encodes to the bytes at its offset, and
		// no entry lies inside a damaged range.
		for _, e := range entries {
			fr := frame(e.op, e.uid, e.data)
			valid := e.off+len(fr) <= len(data) && string(data[e.off:e.off+len(fr)]) == string(fr)
			inDamage := false
			for _, d := range damaged {
				inDamage = inDamage || (e.off >= d.from && e.off < d.to)
			}
			if valid == inDamage {
				t.Fatalf("entry at %d: valid frame %v, in a damaged range %v", e.off, valid, inDamage)
			}
		}
	})
}

func (s *Store) pendingFrames() int {
	s.j.mu.Lock()
	defer s.j.mu.Unlock()
	return s.j.queued
}

// BenchmarkPutConcurrent: 64 writers, each writing its own claims' records
// (as concurrent prepares do), through group commit and compactions. Its
// p99 is to be read against the disk's fdatasync floor.
func BenchmarkPutConcurrent(b *testing.B) {
	s, err := Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	var mu sync.Mutex
	var lat []time.Duration
	var n atomic.Int64
	b.SetParallelism(32) // 64 writers on 2 cores
	b.RunParallel(func(pb *testing.PB) {
		w := n.Add(1)
		i := 0
		var mine []time.Duration
		for pb.Next() {
			c := claim(fmt.Sprintf("w%d-%d", w, i%8))
			t := time.Now()
			if err := s.Put(c); err != nil {
				b.Error(err)
				return
			}
			mine = append(mine, time.Since(t))
			i++
		}
		mu.Lock()
		lat = append(lat, mine...)
		mu.Unlock()
	})
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(len(lat))/float64(s.j.syncs), "puts/fdatasync")
}

// TestJournalIsTheRecord: while the store is open, records live in the
// journal alone (no file is created per claim); Get and List read them
// there; Close writes the files, and a new Open reads the same records.
func TestJournalIsTheRecord(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	for i := range 20 {
		if err := s.Put(claim(fmt.Sprintf("c%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		if err := s.Delete(types.UID(fmt.Sprintf("c%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	files := func() []string {
		m, _ := filepath.Glob(filepath.Join(dir, "*.json"))
		return m
	}
	if f := files(); len(f) != 0 {
		t.Fatalf("record files while open: %v", f)
	}
	claims, corrupt, err := s.List()
	if err != nil || len(corrupt) != 0 || len(claims) != 10 {
		t.Fatalf("List: %d records, %v %v", len(claims), corrupt, err)
	}
	if c, err := s.Get("c3"); c != nil || err != nil {
		t.Fatalf("deleted c3: %v %v", c, err)
	}
	if b, n, err := s.Usage(); err != nil || n != 10 || b == 0 {
		t.Fatalf("Usage: %d bytes, %d records, %v", b, n, err)
	}
	s.Close()
	if f := files(); len(f) != 10 {
		t.Fatalf("after Close: %d record files, want 10", len(f))
	}
	s, _ = Open(dir)
	defer s.Close()
	if c, err := s.Get("c15"); err != nil || c == nil || c.UID != "c15" {
		t.Fatalf("c15 after reopen: %v %v", c, err)
	}
}

// TestJournalDamage: a journal entry that fails its checksum in the middle
// of the journal (bit rot, not a torn tail) fails only what it held. With
// its claim UID readable, that claim reads as corrupt, not as its older
// record; without, List reports the damage under a key Salvage refuses. The
// entries after it load. The next Open keeps the damaged journal for the
// operator, and List keeps reporting it.
func TestJournalDamage(t *testing.T) {
	for _, tc := range []struct {
		name string
		// at is the byte of the damaged frame to flip: 9 is inside its
		// payload's op byte, 0 its length.
		at      int
		wantKey types.UID
	}{
		{"payload", 20, "victim"},
		{"header", 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s, _ := Open(dir)
			old := claim("victim")
			if err := s.Put(old); err != nil {
				t.Fatal(err)
			}
			s.Close() // victim.json holds the old record
			s, _ = Open(dir)
			for _, uid := range []string{"before", "victim", "after"} {
				c := claim(uid)
				c.State = StatePreparing
				if err := s.Put(c); err != nil {
					t.Fatal(err)
				}
			}
			crash(s)
			data, err := os.ReadFile(filepath.Join(dir, journalName))
			if err != nil {
				t.Fatal(err)
			}
			entries, _, _ := parseJournal(data)
			data[entries[1].off+tc.at] ^= 0xff
			if err := os.WriteFile(filepath.Join(dir, journalName), data, 0o600); err != nil {
				t.Fatal(err)
			}

			for round := range 2 {
				// Round 0: another process still holds the store, so the
				// journal is read, not replayed; round 1: a fresh Open
				// replays it into files.
				var holder *Store
				if round == 0 {
					holder, _ = Open(dir)
				}
				s, err := Open(dir)
				if err != nil {
					t.Fatal(err)
				}
				claims, corrupt, err := s.List()
				if err != nil {
					t.Fatal(err)
				}
				got := map[types.UID]State{}
				for _, c := range claims {
					got[c.UID] = c.State
				}
				if got["before"] != StatePreparing || got["after"] != StatePreparing {
					t.Fatalf("round %d: records around the damage: %v", round, got)
				}
				// With no UID left, the damaged entry cannot be blamed on
				// victim, whose older record then loads; the damage report
				// below is what makes the caller fail closed.
				if _, ok := got["victim"]; ok && tc.wantKey != "" {
					t.Fatalf("round %d: victim read as %v despite damage", round, got["victim"])
				}
				if tc.wantKey != "" {
					if !errors.Is(corrupt[tc.wantKey], ErrCorrupt) {
						t.Fatalf("round %d: corrupt %v, want %s", round, corrupt, tc.wantKey)
					}
					if _, err := s.Get(tc.wantKey); !errors.Is(err, ErrCorrupt) {
						t.Fatalf("round %d: Get(victim) = %v", round, err)
					}
				}
				unnamed := 0
				for k, err := range corrupt {
					if k == tc.wantKey {
						continue
					}
					unnamed++
					if !errors.Is(err, ErrCorrupt) {
						t.Errorf("round %d: %s: %v", round, k, err)
					}
					if _, err := s.Salvage(k); err == nil {
						t.Errorf("round %d: Salvage(%s) accepted", round, k)
					}
				}
				if unnamed == 0 {
					t.Fatalf("round %d: damage not reported: %v", round, corrupt)
				}
				s.Close()
				if holder != nil {
					holder.Close()
				}
			}
		})
	}
}

// TestJournalDamageAfterCompaction: damage a running store found in the
// journal is reported once after compaction, by the journal copy kept, not
// also under its offset in a journal that no longer holds it.
func TestJournalDamageAfterCompaction(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	defer s.Close()
	const limit = 16 << 10
	s.j.limit, s.j.compactAt = limit, limit
	holder, _ := Open(dir) // no compaction while it is open
	for _, uid := range []string{"a", "b", "c"} {
		if err := holder.Put(claim(uid)); err != nil {
			t.Fatal(err)
		}
	}
	data, _ := os.ReadFile(filepath.Join(dir, journalName))
	entries, _, _ := parseJournal(data)
	data[entries[1].off] ^= 0xff // b's frame length: no UID left
	if err := os.WriteFile(filepath.Join(dir, journalName), data, 0o600); err != nil {
		t.Fatal(err)
	}
	keys := func() (offsets, kept int) {
		_, corrupt, err := s.List()
		if err != nil {
			t.Fatal(err)
		}
		for k := range corrupt {
			switch {
			case strings.HasPrefix(string(k), journalName+"@"):
				offsets++
			case strings.HasPrefix(string(k), journalName+".damaged-"):
				kept++
			}
		}
		return offsets, kept
	}
	if o, k := keys(); o != 1 || k != 0 {
		t.Fatalf("before compaction: %d offset reports, %d kept journals; want 1, 0", o, k)
	}
	holder.Close()
	for i := 0; i < 200; i++ {
		if err := s.Put(claim(fmt.Sprintf("x%d", i%5))); err != nil {
			t.Fatal(err)
		}
		if m, _ := filepath.Glob(filepath.Join(dir, journalName+".damaged-*")); len(m) > 0 {
			break // compacted
		}
	}
	if o, k := keys(); o != 0 || k != 1 {
		t.Fatalf("after compaction: %d offset reports, %d kept journals; want 0, 1", o, k)
	}
}
