package cdihook

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// script writes an executable shell script named nvidia-cdi-hook in a
// directory of its own and returns its path.
func script(t *testing.T, body string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), Name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

const versionScript = `[ "$1" = --version ] || exit 9
echo "NVIDIA CDI Hook version 1.19.1"
echo "commit: 0123456"`

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup returns the options; Path is left empty unless the case
		// sets it.
		setup   func(t *testing.T) Options
		want    string
		wantErr []string
	}{
		{
			name:  "runs",
			setup: func(t *testing.T) Options { return Options{HostPath: script(t, versionScript, 0o755)} },
			want:  "NVIDIA CDI Hook version 1.19.1",
		},
		{
			name: "seen at a container path",
			setup: func(t *testing.T) Options {
				return Options{HostPath: "/var/lib/facet-cdi-hook/" + Name, Path: script(t, versionScript, 0o755)}
			},
			want: "NVIDIA CDI Hook version 1.19.1",
		},
		{
			name: "missing",
			setup: func(t *testing.T) Options {
				return Options{HostPath: "/usr/bin/" + Name, Path: filepath.Join(t.TempDir(), Name)}
			},
			wantErr: []string{"host path /usr/bin/nvidia-cdi-hook (seen by the plugin at", "does not exist"},
		},
		{
			name:    "not executable",
			setup:   func(t *testing.T) Options { return Options{HostPath: script(t, versionScript, 0o644)} },
			wantErr: []string{"is not executable (mode -rw-r--r--)"},
		},
		{
			name: "a directory",
			setup: func(t *testing.T) Options {
				p := filepath.Join(t.TempDir(), Name)
				if err := os.Mkdir(p, 0o755); err != nil {
					t.Fatal(err)
				}
				return Options{HostPath: p}
			},
			wantErr: []string{"is not a regular file"},
		},
		{
			name: "fails",
			setup: func(t *testing.T) Options {
				return Options{HostPath: script(t, `echo "GLIBC_2.99 not found" >&2; exit 1`, 0o755)}
			},
			wantErr: []string{"does not run", "exit status 1", "GLIBC_2.99 not found"},
		},
		{
			name: "not a program",
			setup: func(t *testing.T) Options {
				p := filepath.Join(t.TempDir(), Name)
				if err := os.WriteFile(p, []byte("\x7fELF garbage"), 0o755); err != nil {
					t.Fatal(err)
				}
				return Options{HostPath: p}
			},
			wantErr: []string{"does not run", "exec format error"},
		},
		{
			name: "hangs",
			setup: func(t *testing.T) Options {
				return Options{HostPath: script(t, "exec sleep 60", 0o755), Timeout: 100 * time.Millisecond}
			},
			wantErr: []string{"did not answer --version within 100ms"},
		},
		{
			name:    "wrong name",
			setup:   func(t *testing.T) Options { return Options{HostPath: "/usr/bin/nvidia-ctk"} },
			wantErr: []string{"is not named nvidia-cdi-hook"},
		},
		{
			name:    "relative",
			setup:   func(t *testing.T) Options { return Options{HostPath: "bin/" + Name} },
			wantErr: []string{"is not an absolute path"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.setup(t)
			got, err := Check(context.Background(), o)
			if len(tc.wantErr) > 0 {
				var he *Error
				if !errors.As(err, &he) {
					t.Fatalf("Check = %q, %v; want an *Error", got, err)
				}
				// Every refusal says how to fix it.
				for _, s := range append(tc.wantErr, o.HostPath, Flag, ChartInstallVal, ChartHostPathVal) {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not contain %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("version %q, want %q", got, tc.want)
			}
		})
	}
}

func TestInstall(t *testing.T) {
	src := script(t, versionScript, 0o755)
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		before    func(t *testing.T, dir string) // what is on the host
		wantWrote bool
		wantErr   string
	}{
		{name: "fresh node", wantWrote: true},
		{
			name: "already installed",
			before: func(t *testing.T, dir string) {
				if err := os.WriteFile(filepath.Join(dir, Name), data, 0o755); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "an older hook",
			before: func(t *testing.T, dir string) {
				if err := os.WriteFile(filepath.Join(dir, Name), []byte("#!/bin/sh\necho old\n"), 0o755); err != nil {
					t.Fatal(err)
				}
			},
			wantWrote: true,
		},
		{
			name: "same bytes, lost its execute bit",
			before: func(t *testing.T, dir string) {
				if err := os.WriteFile(filepath.Join(dir, Name), data, 0o644); err != nil {
					t.Fatal(err)
				}
			},
			wantWrote: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "facet-cdi-hook")
			if tc.before != nil {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				tc.before(t, dir)
			}
			wrote, version, err := Install(context.Background(), src, dir)
			if err != nil {
				t.Fatal(err)
			}
			if wrote != tc.wantWrote || version != "NVIDIA CDI Hook version 1.19.1" {
				t.Errorf("wrote %v, version %q; want wrote %v", wrote, version, tc.wantWrote)
			}
			got, err := os.ReadFile(filepath.Join(dir, Name))
			if err != nil || !bytes.Equal(got, data) {
				t.Errorf("installed file %q, %v", got, err)
			}
			entries, _ := os.ReadDir(dir)
			if len(entries) != 1 {
				t.Errorf("the directory holds %d entries, want only %s", len(entries), Name)
			}
		})
	}
	t.Run("source that does not run", func(t *testing.T) {
		bad := script(t, "exit 3", 0o755)
		_, _, err := Install(context.Background(), bad, t.TempDir())
		if err == nil || !strings.Contains(err.Error(), "does not run") {
			t.Fatalf("error %v", err)
		}
	})
	t.Run("missing source", func(t *testing.T) {
		_, _, err := Install(context.Background(), filepath.Join(t.TempDir(), Name), t.TempDir())
		if !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("error %v", err)
		}
	})
}
