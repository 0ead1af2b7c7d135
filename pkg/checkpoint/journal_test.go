package checkpoint

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
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

// TestReplayAfterPowerLoss: record files lost or stale (as a power loss
// leaves files written without fsync) are restored from the journal at
// the next Open, deletes are redone, and the journal is emptied.
func TestReplayAfterPowerLoss(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	a, b, gone := claim("a"), claim("b"), claim("gone")
	for _, c := range []*Claim{a, b, gone} {
		if err := s.Put(c); err != nil {
			t.Fatal(err)
		}
	}
	b.State = StatePreparing
	if err := s.Put(b); err != nil {
		t.Fatal(err)
	}
	stale, _ := os.ReadFile(filepath.Join(dir, "gone.json"))
	if err := s.Delete("gone"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	// The "power loss": a's file never reached the disk, b's is an older
	// version, and gone's removal was lost.
	os.Remove(filepath.Join(dir, "a.json"))
	if err := os.WriteFile(filepath.Join(dir, "b.json"), []byte{}, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "gone.json"), stale, 0o600); err != nil {
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
}

// TestTornJournalTail: a batch a crash cut short is ignored; the entries
// before it are replayed.
func TestTornJournalTail(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	if err := s.Put(claim("a")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	os.Remove(filepath.Join(dir, "a.json"))
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
}

func FuzzParseJournal(f *testing.F) {
	f.Add(frame(opPut, "a", []byte(`{"x":1}`)))
	f.Add(append(frame(opDelete, "a", nil), 0, 0, 0))
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 0, 'P'})
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, _ := parseJournal(data)
		var again []byte
		for _, e := range entries {
			again = append(again, frame(e.op, e.uid, e.data)...)
		}
		if len(again) > len(data) || string(again) != string(data[:len(again)]) {
			t.Fatalf("entries do not re-encode to the journal's prefix")
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
