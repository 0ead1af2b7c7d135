package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestContributingMap: docs/contributing.md's map of the code names every
// Go package and binary of the module, and every facetctl command of the
// usage text, so that the map a newcomer reads first cannot go stale.
func TestContributingMap(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "contributing.md"))
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(doc), "| Package | Job |")
	if i < 0 {
		t.Fatal("docs/contributing.md has no package map (| Package | Job |)")
	}
	// The map is one table per wing, up to the "Details:" that follow it.
	table, _, found := strings.Cut(string(doc[i:]), "\nDetails:")
	if !found {
		t.Fatal("docs/contributing.md's package map is not followed by Details:")
	}
	out, err := exec.Command("go", "list", "-f", "{{.Dir}}", "../../...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(table, "`"+filepath.ToSlash(rel)+"`") {
			t.Errorf("package %s is not in docs/contributing.md's map", rel)
		}
	}
	// The test/helm module's packages.
	for _, rel := range []string{"test/helm"} {
		if !strings.Contains(table, "`"+rel+"`") {
			t.Errorf("%s is not in docs/contributing.md's map", rel)
		}
	}
	var row string
	for _, l := range strings.Split(table, "\n") {
		if strings.HasPrefix(l, "| `cmd/facetctl` |") {
			row = l
		}
	}
	command := regexp.MustCompile(`^  ([a-z][a-z-]+)(\s|$)`)
	n := 0
	for _, l := range strings.Split(usage, "\n") {
		m := command.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		n++
		if !strings.Contains(row, "`"+m[1]+"`") {
			t.Errorf("facetctl %s is not in the map's cmd/facetctl row: %s", m[1], row)
		}
	}
	if n < 10 {
		t.Fatalf("found %d commands in facetctl's usage; has its layout changed?", n)
	}
}
