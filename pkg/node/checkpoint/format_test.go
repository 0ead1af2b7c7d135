package checkpoint

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
)

var updateFormat = flag.Bool("update-format", false, "write testdata/format-v<Version>.fields for a new Version")

// recordFields lists every field a record carries, as "Type.json: kind",
// sorted: the envelope and every struct it holds, followed through
// pointers, slices and maps.
func recordFields() []string {
	var out []string
	seen := map[reflect.Type]bool{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || seen[t] || t.PkgPath() != reflect.TypeOf(envelope{}).PkgPath() {
			return
		}
		seen[t] = true
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" || !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			out = append(out, fmt.Sprintf("%s.%s: %s", t.Name(), name, f.Type))
			walk(f.Type)
		}
	}
	// The envelope carries the claim as raw JSON, checksummed.
	walk(reflect.TypeOf(envelope{}))
	walk(reflect.TypeOf(Claim{}))
	sort.Strings(out)
	return out
}

// TestRecordFormatGuard: a record of the same format with a field its
// reader does not know is refused as damage (decode), so a release that
// adds, drops or renames a record field without a new Version breaks
// `helm rollback`: the rolled-back plugin refuses every record the newer
// one wrote, and their claims fail. This fails on any such change until
// Version is bumped (with MinReader where an older reader must refuse the
// records) and testdata/format-v<Version>.fields is written for it
// (go test ./pkg/node/checkpoint -run TestRecordFormatGuard -update-format).
func TestRecordFormatGuard(t *testing.T) {
	path := filepath.Join("testdata", fmt.Sprintf("format-v%d.fields", Version))
	got := strings.Join(recordFields(), "\n") + "\n"
	if *updateFormat {
		if _, err := os.Stat(path); err == nil {
			t.Fatalf("%s exists: a format's fields never change; bump Version for new ones", path)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v: a new Version needs its field list (-update-format)", err)
	}
	if got != string(want) {
		t.Errorf("the checkpoint record's fields changed under format %d (Version), which breaks a rollback to a build of this format: bump Version, set MinReader as checkpoint.go says, and write the new list with -update-format.\nformat %d has:\n%s\nthis build writes:\n%s", Version, Version, want, got)
	}
}
