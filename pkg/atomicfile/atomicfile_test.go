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
