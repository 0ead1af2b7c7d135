// Package mpssim is the simulated driver root's stand-in for NVIDIA's
// nvidia-cuda-mps-control: a POSIX shell script that behaves, for what
// Facet relies on, like the real control daemon, and records what it did.
//
// Like the real program it reads CUDA_MPS_PIPE_DIRECTORY (default
// /tmp/nvidia-mps) and CUDA_MPS_LOG_DIRECTORY (default /var/log/nvidia-mps).
// With -d it daemonises: the daemon writes nvidia-cuda-mps-control.pid and
// the control pipe into the pipe directory and logs "startup" to
// control.log, and the -d process returns once the daemon listens. A second
// -d on a pipe directory whose daemon lives fails, as the real one does
// ("An instance of this daemon is already running"). Without -d it is a
// client: it sends each line of its standard input to the daemon, tagged
// with the caller's UID, PID and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, so that
// a container of a claim can prove what it saw ("client" lines in
// control.log); "quit" stops the daemon and waits for it to be gone.
//
// The daemon also writes a marker into /dev/shm, so a test can see whether
// it ran with the GPU's own shared-memory directory there, and logs the
// libcuda.so.1 its servers would load: the first in LD_LIBRARY_PATH's
// directories or the loader's default ones (usr/lib/<triplet>, usr/lib64,
// lib64), so a test can see which driver's libraries it reached.
//
// WriteRoot lays out a root that the stand-in runs chrooted in, as Facet
// runs the real program in the driver root; WritePrefix a host's root with
// a driver under a prefix of its own, whose stand-in runs chrooted into
// the host's root; Write installs the script alone.
//
// Log lines (control.log), one per event: "startup pid=<pid> gpu=<CUDA_VISIBLE_DEVICES> libcuda=<path, or none>",
// "client uid=<uid> pid=<pid> pct=<percent> cmd=<command>", "quit", "terminated".
package mpssim

import (
	"fmt"
	"os"
	"path/filepath"
)

// ControlRel is the stand-in's path below a root laid out by WriteRoot,
// where a distribution's driver package puts nvidia-cuda-mps-control.
const ControlRel = "usr/bin/nvidia-cuda-mps-control"

// ShmMarker is the file the stand-in daemon creates in its /dev/shm.
const ShmMarker = "facet-mps-standin"

// Script is the stand-in's text.
const Script = `#!/bin/sh
# Simulated by Facet: a stand-in for NVIDIA's nvidia-cuda-mps-control
# (package internal/mps/mpssim). It schedules nothing on any GPU.
pipe="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}"
logd="${CUDA_MPS_LOG_DIRECTORY:-/var/log/nvidia-mps}"
pidf="$pipe/nvidia-cuda-mps-control.pid"
log() { echo "$(date -u +%Y-%m-%dT%H:%M:%S) $*" >> "$logd/control.log"; }
# libcuda: where the loader would find libcuda.so.1 for a server.
libcuda() {
	old="$IFS"
	IFS=:
	for d in ${LD_LIBRARY_PATH:-} /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /lib64; do
		if [ -n "$d" ] && [ -e "$d/libcuda.so.1" ]; then
			IFS="$old"
			echo "$d/libcuda.so.1"
			return
		fi
	done
	IFS="$old"
	echo none
}
alive() { [ -s "$pidf" ] && kill -0 "$(cat "$pidf")" 2>/dev/null; }
case "$1" in
-d)
	mkdir -p "$pipe" "$logd" || exit 1
	if alive; then
		echo "An instance of this daemon is already running" >&2
		exit 1
	fi
	rm -f "$pipe/control" "$pidf"
	if command -v setsid >/dev/null 2>&1; then
		setsid "$0" --serve </dev/null >/dev/null 2>&1 &
	else
		"$0" --serve </dev/null >/dev/null 2>&1 &
	fi
	i=0
	while [ ! -p "$pipe/control" ] || [ ! -s "$pidf" ]; do
		i=$((i + 1))
		[ "$i" -gt 3000 ] && { echo "daemon did not start" >&2; exit 1; }
		sleep 0.01
	done
	exit 0
	;;
--serve)
	trap 'log terminated; rm -f "$pipe/control" "$pidf"; exit 0' TERM INT
	mkfifo -m 0666 "$pipe/control" || exit 1
	: > "$pipe/control_lock"
	echo "x" > "/dev/shm/` + ShmMarker + `.$$" 2>/dev/null
	log "startup pid=$$ gpu=${CUDA_VISIBLE_DEVICES:-} libcuda=$(libcuda)"
	echo $$ > "$pidf.tmp" && mv "$pidf.tmp" "$pidf"
	while :; do
		while read -r line; do
			log "client $line"
			case "$line" in
			*cmd=quit*)
				log quit
				rm -f "$pipe/control" "$pidf" "/dev/shm/` + ShmMarker + `.$$"
				exit 0
				;;
			esac
		done < "$pipe/control"
	done
	;;
*)
	# A client may live in another PID namespace (a container): it knows
	# the daemon by its pipe alone.
	if [ ! -p "$pipe/control" ]; then
		echo "Cannot find MPS control daemon process" >&2
		exit 1
	fi
	while read -r cmd; do
		[ -n "$cmd" ] || continue
		echo "uid=$(id -u) pid=$$ pct=${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE:-} cmd=$cmd" > "$pipe/control"
		if [ "$cmd" = quit ]; then
			while [ -p "$pipe/control" ]; do sleep 0.01; done
		fi
	done
	exit 0
	;;
esac
`

// Write installs the stand-in as <dir>/nvidia-cuda-mps-control (mode 0755).
func Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	p := filepath.Join(dir, "nvidia-cuda-mps-control")
	if err := os.WriteFile(p, []byte(Script), 0o755); err != nil {
		return fmt.Errorf("MPS stand-in: %w", err)
	}
	return os.Chmod(p, 0o755)
}
