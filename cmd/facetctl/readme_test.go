package main

import (
	"bufio"
	"os"
	"regexp"
	"strings"
	"testing"
)

// readmeCommands returns the commands of the README's ```sh blocks, one per
// command: continuation lines joined, comments dropped.
func readmeCommands(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cmds []string
	in, cont := false, ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !in && strings.TrimSpace(line) == "```sh":
			in = true
			continue
		case in && strings.TrimSpace(line) == "```":
			in = false
			continue
		case !in:
			continue
		}
		if i := strings.Index(line, " #"); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		if strings.HasSuffix(line, `\`) {
			cont += strings.TrimSuffix(line, `\`) + " "
			continue
		}
		line = strings.TrimSpace(cont + line)
		cont = ""
		if line != "" && !strings.HasPrefix(line, "#") {
			cmds = append(cmds, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return cmds
}

// TestREADMECommands keeps the README's commands from going stale: each
// command of its ```sh blocks is a target of the Makefile (`make demo`,
// `make test` and the others run them), a `facetctl slices --machine`
// preview that this test runs, or a command the demo itself runs or prints
// for the user (hack/demo.sh).
func TestREADMECommands(t *testing.T) {
	const root = "../../"
	makefile, err := os.ReadFile(root + "Makefile")
	if err != nil {
		t.Fatal(err)
	}
	demo, err := os.ReadFile(root + "hack/demo.sh")
	if err != nil {
		t.Fatal(err)
	}
	demoText := strings.ReplaceAll(string(demo), "${RUN_DIR}", "/tmp/facet-run")
	cmds := readmeCommands(t, root+"README.md")
	if len(cmds) < 5 {
		t.Fatalf("found %d commands in the README's sh blocks: %q", len(cmds), cmds)
	}
	ran := 0
	for _, c := range cmds {
		t.Run(c, func(t *testing.T) {
			fields := strings.Fields(c)
			switch {
			case fields[0] == "make":
				for _, target := range fields[1:] {
					if strings.Contains(target, "=") {
						continue // a variable
					}
					if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(target) + `:`).Match(makefile) {
						t.Errorf("make %s: no such target in the Makefile", target)
					}
				}
			case (fields[0] == "bin/facetctl" || fields[0] == "facetctl") && len(fields) > 1 && fields[1] == "slices":
				args := make([]string, 0, len(fields)-2)
				machine := false
				for _, a := range fields[2:] {
					if strings.HasPrefix(a, "demo/") {
						a = root + a
						machine = true
					}
					args = append(args, a)
				}
				if !machine {
					t.Fatalf("%q: only previews of a demo machine file can run here", c)
				}
				out, err := captureStdout(t, func() error { return runSlices(args) })
				if err != nil {
					t.Fatalf("%s: %v", c, err)
				}
				if !strings.Contains(out, "kind: ResourceSlice") {
					t.Fatalf("%s printed no ResourceSlice:\n%.500s", c, out)
				}
				ran++
			default:
				if !strings.Contains(demoText, c) {
					t.Errorf("%q is neither a make target, a facetctl preview, nor run or printed by hack/demo.sh", c)
				}
			}
		})
	}
	if ran == 0 {
		t.Error("no facetctl preview of the README ran")
	}
}
