package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

func claim(uid string) *Claim {
	return &Claim{UID: types.UID(uid), Namespace: "ns", Name: "c-" + uid, State: StatePrepared, CDISpec: "spec.json",
		Devices: []Device{{Requests: []string{"gpu"}, Pool: "node", Device: "gpu-0", GPUUUID: "GPU-1", CDIDeviceIDs: []string{"gpu.facet.dev/claim=x"}}}}
}

func TestRoundTripAndDelete(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if c, err := s.Get("missing"); c != nil || err != nil {
		t.Fatalf("missing claim: %v %v", c, err)
	}
	want := claim("a")
	if err := s.Put(want); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get("a")
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v %v", got, err)
	}
	want.State = StatePreparing
	if err := s.Put(want); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get("a"); got.State != StatePreparing {
		t.Fatalf("overwrite lost: %+v", got)
	}
	if err := s.Delete("a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("a"); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if c, _ := s.Get("a"); c != nil {
		t.Fatal("deleted claim still there")
	}
}

// TestCorruptionIsContained: every kind of damage fails only its own claim.
func TestCorruptionIsContained(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(data []byte) []byte
		want   string
	}{
		{"truncated", func(d []byte) []byte { return d[:len(d)/2] }, "corrupt checkpoint"},
		{"empty", func([]byte) []byte { return nil }, "corrupt checkpoint"},
		{"bit flip in record", func(d []byte) []byte { return []byte(strings.Replace(string(d), "gpu-0", "gpu-9", 1)) }, "checksum"},
		{"future version no older build may read", func(d []byte) []byte {
			return []byte(strings.Replace(strings.Replace(string(d), fmt.Sprintf(`"version": %d`, Version), `"version": 7`, 1), fmt.Sprintf(`"minReader": %d`, MinReader), `"minReader": 7`, 1))
		}, "roll forward"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s, _ := Open(dir)
			for _, uid := range []string{"good1", "bad", "good2"} {
				if err := s.Put(claim(uid)); err != nil {
					t.Fatal(err)
				}
			}
			// Files are what a later start reads; damage them there.
			s.Close()
			s, _ = Open(dir)
			defer s.Close()
			path := filepath.Join(dir, "bad.json")
			data, _ := os.ReadFile(path)
			if err := os.WriteFile(path, tc.damage(data), 0o600); err != nil {
				t.Fatal(err)
			}
			// A temp file left by a crash mid-write is swept, not loaded.
			if err := os.WriteFile(filepath.Join(dir, ".tmp-good1.json-123"), []byte("{"), 0o600); err != nil {
				t.Fatal(err)
			}

			_, err := s.Get("bad")
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("Get(bad) = %v, want ErrCorrupt naming %s and %q", err, path, tc.want)
			}
			claims, corrupt, err := s.List()
			if err != nil {
				t.Fatal(err)
			}
			if len(claims) != 2 || len(corrupt) != 1 || corrupt["bad"] == nil {
				t.Fatalf("List: %d good, corrupt %v", len(claims), corrupt)
			}
			if _, err := os.Stat(filepath.Join(dir, ".tmp-good1.json-123")); !os.IsNotExist(err) {
				t.Fatalf("temp file not swept: %v", err)
			}
		})
	}
}

func TestRecordForAnotherClaimIsCorrupt(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	if err := s.Put(claim("a")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, _ = Open(dir)
	defer s.Close()
	if err := os.Rename(filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("b"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("got %v", err)
	}
}

func TestUsage(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if b, n, err := s.Usage(); b != 0 || n != 0 || err != nil {
		t.Fatalf("empty store: %d bytes, %d records, %v", b, n, err)
	}
	for _, uid := range []string{"a", "b"} {
		if err := s.Put(claim(uid)); err != nil {
			t.Fatal(err)
		}
	}
	// Neither a temp file nor a stray file counts; a corrupt record does.
	for name, content := range map[string]string{".tmp-a.json-1": "xx", "notes.txt": "xx", "c.json": "garbage"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// a and b are in the journal, not yet in files: compact them.
	s.Close()
	s, _ = Open(dir)
	defer s.Close()
	var want int64
	for _, name := range []string{"a.json", "b.json", "c.json"} {
		info, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		want += info.Size()
	}
	b, n, err := s.Usage()
	if err != nil || b != want || n != 3 {
		t.Fatalf("Usage() = %d bytes, %d records, %v; want %d bytes, 3 records", b, n, err, want)
	}
}

// TestPeekAll: the records of a store another process holds open, journal
// entries included, read without opening it: nothing is written, created or
// tidied, and damage is listed, not fatal.
func TestPeekAll(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, uid := range []string{"a", "b"} {
		if err := s.Put(claim(uid)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Delete("b"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "c.json"), []byte("{not a record"), 0o600); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, ".tmp-a.json-123")
	if err := os.WriteFile(tmp, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}

	claims, corrupt, err := PeekAll(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(claims) != 1 || claims[0].UID != "a" || claims[0].Name != "c-a" {
		t.Errorf("claims %+v, want only a (b deleted in the journal)", claims)
	}
	if _, ok := corrupt["c"]; !ok || len(corrupt) != 1 {
		t.Errorf("corrupt %v, want c", corrupt)
	}
	after, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Errorf("PeekAll changed the directory: %d entries before, %d after", len(before), len(after))
	}
	if _, err := os.Stat(tmp); err != nil {
		t.Errorf("PeekAll removed a temp file of the store's: %v", err)
	}

	missing := filepath.Join(t.TempDir(), "none")
	claims, corrupt, err = PeekAll(missing)
	if err != nil || len(claims) != 0 || len(corrupt) != 0 {
		t.Errorf("missing directory: %v %v %v, want no record", claims, corrupt, err)
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("PeekAll created %s: %v", missing, err)
	}
}

// TestFromOtherBoot: only a record and a node that both know their boot
// IDs, and differ, are of another boot.
func TestFromOtherBoot(t *testing.T) {
	for _, tc := range []struct {
		name, record, now string
		want              bool
	}{
		{"same boot", "b1", "b1", false},
		{"rebooted since", "b1", "b2", true},
		{"record of an earlier version", "", "b2", false},
		{"boot ID unreadable now", "b1", "", false},
		{"neither known", "", "", false},
	} {
		c := &Claim{BootID: tc.record}
		if got := c.FromOtherBoot(tc.now); got != tc.want {
			t.Errorf("%s: FromOtherBoot(%q) of a record of boot %q = %v, want %v", tc.name, tc.now, tc.record, got, tc.want)
		}
	}
}
