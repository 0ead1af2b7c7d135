package atomicfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	for i, data := range []string{"first", "second, longer"} {
		if err := Write(dir, "f.json", ".tmp-f-", []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dir, "f.json"))
		if err != nil || string(got) != data {
			t.Fatalf("write %d: %q %v", i, got, err)
		}
	}
	st, err := os.Stat(filepath.Join(dir, "f.json"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v %v", st.Mode(), err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}
	// A directory that is not there: the error names the file, and
	// nothing is created.
	err = Write(filepath.Join(dir, "missing"), "g.json", ".tmp-", []byte("x"), 0o644)
	if err == nil || !strings.Contains(err.Error(), "missing/g.json") {
		t.Errorf("error %v", err)
	}
}

// TestWriteWith: the options of the one atomic writer: the mode, the
// temporary file's pattern (the sweeps of pkg/node/claimcdi and pkg/node/checkpoint find
// leftovers by it), and no leftover when the rename fails.
func TestWriteWith(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		want os.FileMode
	}{
		{name: "default mode, durable", o: Options{TempPattern: ".t-*"}, want: 0o600},
		{name: "executable, durable", o: Options{TempPattern: ".hook.tmp.*", Perm: 0o755}, want: 0o755},
		{name: "not fsynced", o: Options{TempPattern: ".facet-spec-x.*.tmp", Perm: 0o644, NoSync: true}, want: 0o644},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := WriteWith(dir, "f", []byte("one"), tc.o); err != nil {
				t.Fatal(err)
			}
			if err := WriteWith(dir, "f", []byte("two"), tc.o); err != nil {
				t.Fatal(err)
			}
			st, err := os.Stat(filepath.Join(dir, "f"))
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm() != tc.want {
				t.Errorf("mode %v, want %v", st.Mode().Perm(), tc.want)
			}
			if b, _ := os.ReadFile(filepath.Join(dir, "f")); string(b) != "two" {
				t.Errorf("contents %q", b)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 1 {
				t.Errorf("leftovers: %v", entries)
			}
			// A target that is a directory: the rename fails, and the
			// temporary file goes.
			if err := os.Mkdir(filepath.Join(dir, "d"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "d", "x"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := WriteWith(dir, "d", []byte("x"), tc.o); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "d")) {
				t.Errorf("over a directory: %v, want an error naming it", err)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 2 {
				t.Errorf("leftovers after a failed rename: %v", entries)
			}
		})
	}
}

// TestWriteJSON: indented JSON with a final newline, at the mode asked;
// a value JSON cannot encode is an error naming the file, and writes
// nothing.
func TestWriteJSON(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "r.json")
	if err := WriteJSON(path, ".tmp-r-", map[string]int{"b": 2, "a": 1}, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if want := "{\n  \"a\": 1,\n  \"b\": 2\n}\n"; err != nil || string(got) != want {
		t.Errorf("wrote %q (%v), want %q", got, err, want)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("mode %v %v", st.Mode(), err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := WriteJSON(bad, ".tmp-bad-", map[string]any{"f": func() {}}, 0o644); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("an unencodable value: %v, want an error naming %s", err, bad)
	}
	if _, err := os.Stat(bad); !os.IsNotExist(err) {
		t.Errorf("an unencodable value left a file: %v", err)
	}
}
