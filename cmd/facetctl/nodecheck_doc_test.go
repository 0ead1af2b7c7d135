package main

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// docCommand is a `facetctl node-check` command of a docs page's
// ```console blocks: its arguments after "node-check", how it is run
// (the words before facetctl), and the output the page shows for it.
type docCommand struct {
	line, runner string
	args         []string
	output       []string
}

// nodeCheckDocCommands returns the node-check commands of path's
// ```console blocks, continuation lines joined; a "$ " prompt marks a
// command whose following lines are its output.
func nodeCheckDocCommands(t *testing.T, path string) []docCommand {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cmds []docCommand
	var cur *docCommand
	in, cont := false, ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !in && strings.TrimSpace(line) == "```console":
			in, cur = true, nil
			continue
		case in && strings.TrimSpace(line) == "```":
			in = false
			continue
		case !in:
			continue
		}
		if strings.HasSuffix(line, `\`) {
			cont += strings.TrimSpace(strings.TrimSuffix(line, `\`)) + " "
			continue
		}
		full := strings.TrimSpace(cont + strings.TrimSpace(line))
		cont = ""
		prompt := strings.HasPrefix(full, "$ ")
		before, after, ok := strings.Cut(strings.TrimPrefix(full, "$ ")+" ", "facetctl node-check ")
		if !ok {
			if cur != nil {
				cur.output = append(cur.output, line)
			}
			continue
		}
		args := strings.Fields(after)
		if n := len(args); n > 0 && args[n-1] == "2>/dev/null" {
			args = args[:n-1]
		}
		cmds = append(cmds, docCommand{line: full, runner: strings.TrimSpace(before), args: args})
		cur = nil
		if prompt {
			cur = &cmds[len(cmds)-1]
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return cmds
}

// TestNodeCheckDocCommands keeps docs/node-check.md's commands runnable as
// written: each one's flags parse, its paths are absolute, and the
// simulated node's check, run here as root, prints the report the page
// shows. (A real H200 run of the page's host command found its MPS
// prepares failing, docs/mps.md; the page's sample report was stale.)
func TestNodeCheckDocCommands(t *testing.T) {
	const root = "../../"
	cmds := nodeCheckDocCommands(t, root+"docs/node-check.md")
	if len(cmds) < 4 {
		t.Fatalf("found %d node-check commands in docs/node-check.md: %+v", len(cmds), cmds)
	}
	repo, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, c := range cmds {
		t.Run(c.line, func(t *testing.T) {
			fs, a := nodeCheckFlags(io.Discard)
			args := make([]string, len(c.args))
			for i, arg := range c.args {
				args[i] = strings.ReplaceAll(arg, "$PWD", repo)
			}
			if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
				t.Fatalf("%v, arguments left %q", err, fs.Args())
			}
			for _, p := range []string{*a.driverRoot, *a.devRoot, *a.hostRoot, *a.cdiHook, *a.hamiLib, *a.nvmlLib} {
				if p != "" && !filepath.IsAbs(p) {
					t.Errorf("path %q is not absolute", p)
				}
			}
			if *a.hostRoot != "" && *a.hostRoot != "/" {
				t.Errorf("--host-root %s: on the host, the host's root is /", *a.hostRoot)
			}
			if c.runner == "sudo ./facetctl" && *a.driverRoot != "/" && *a.hostRoot == "" {
				t.Errorf("a driver under the prefix %s on the host without --host-root /: its shares would be time-sliced", *a.driverRoot)
			}
			if *a.machine == "" {
				return
			}
			// The simulated node's check, as the page runs it.
			if os.Geteuid() != 0 {
				t.Skip("the simulated node's check lays out device nodes and runs MPS: needs root (CI runs as root)")
			}
			if len(c.output) == 0 {
				t.Fatal("the page shows no output for it")
			}
			// make build's nvidia-cdi-hook may not be built: any
			// executable stands in (the check only names it in specs).
			hook := filepath.Join(t.TempDir(), "nvidia-cdi-hook")
			if err := os.WriteFile(hook, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			for i, arg := range args {
				switch {
				case arg == filepath.Join(repo, "bin", "nvidia-cdi-hook"):
					args[i] = hook
				case strings.HasPrefix(arg, "demo/"):
					args[i] = filepath.Join(repo, arg)
				}
			}
			var stdout bytes.Buffer
			if err := runNodeCheck(args, &stdout, io.Discard); err != nil {
				t.Fatal(err)
			}
			got := strings.Split(strings.TrimRight(stdout.String(), "\n"), "\n")
			want := c.output
			for i := range want {
				want[i] = strings.ReplaceAll(want[i], "demo/machines/", filepath.Join(repo, "demo/machines")+"/")
			}
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("the check printed\n%s\nthe page shows\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			ran++
		})
	}
	if ran == 0 && os.Geteuid() == 0 {
		t.Error("no simulated node-check of the page ran")
	}
}
