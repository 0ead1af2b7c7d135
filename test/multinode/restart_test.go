package multinode

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/facet-gpu/facet/pkg/node/checkpoint"
)

// TestPluginRestart restarts one node's plugin while pods start on the
// other nodes. Those pods run meanwhile and the other nodes' ResourceSlices
// are not touched; after the restart, the node's earlier pod still holds its
// claim (prepared: checkpoint and CDI spec in place) and a new pod there runs.
func TestPluginRestart(t *testing.T) {
	for _, tc := range []struct {
		name string
		node gpuNode
		sig  syscall.Signal
	}{
		// A crash: no chance to clean up.
		{"L4 plugin killed (SIGKILL)", l4, syscall.SIGKILL},
		// A rollout's stop, on the node whose claims carve MIG instances.
		{"H100 plugin stopped (SIGTERM)", h100, syscall.SIGTERM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNamespace(t)
			// Registered after newNamespace, so it runs first: the
			// namespace's pods need a plugin to unprepare their claims.
			t.Cleanup(func() {
				if tc.node.pluginPID(t) == 0 {
					tc.node.restartPlugin(t)
				}
			})
			var others []gpuNode
			for _, n := range gpuNodes {
				if n.name != tc.node.name {
					others = append(others, n)
				}
			}

			createPod(t, ns, "before", landsOn[tc.node.name], nil)
			before := waitRunning(t, ns, "before")
			beforeDevices := checkOn(t, before, tc.node.name)
			beforeClaim := podClaim(t, before)
			slicesBefore := sliceVersions(t, others)

			pid := tc.node.pluginPID(t)
			if pid == 0 {
				t.Fatalf("%s's plugin is not running", tc.node.name)
			}
			if err := syscall.Kill(pid, tc.sig); err != nil {
				t.Fatal(err)
			}
			waitFor(t, tc.node.name+"'s plugin gone", 30*time.Second, func() (bool, error) {
				return !processRuns(pid), fmt.Errorf("pid %d still runs", pid)
			})
			down := time.Now()

			for _, n := range others {
				name := "during-" + n.name
				createPod(t, ns, name, landsOn[n.name], nil)
				checkOn(t, waitRunning(t, ns, name), n.name)
			}
			if tc.node.pluginPID(t) != 0 {
				t.Fatalf("%s's plugin runs again: the other nodes' pods did not start while it was down", tc.node.name)
			}
			t.Logf("other nodes' pods Running %s after %s's plugin went down", time.Since(down).Round(time.Millisecond), tc.node.name)
			checkSlicesUnchanged(t, slicesBefore, sliceVersions(t, others))

			tc.node.restartPlugin(t)
			t.Logf("%s's plugin ready %s after it went down", tc.node.name, time.Since(down).Round(time.Millisecond))

			after := getPod(t, ns, "before")
			if after.UID != before.UID || after.Spec.NodeName != tc.node.name || after.Status.Phase != before.Status.Phase {
				t.Errorf("earlier pod changed: %s on %q, %s", after.UID, after.Spec.NodeName, after.Status.Phase)
			}
			claim := podClaim(t, after)
			reserved := false
			for _, r := range claim.Status.ReservedFor {
				reserved = reserved || r.UID == before.UID
			}
			if claim.UID != beforeClaim.UID || claim.Status.Allocation == nil || !reserved {
				t.Errorf("earlier pod's claim %s (was %s) lost its allocation or reservation: %+v", claim.UID, beforeClaim.UID, claim.Status)
			}
			// The record is read as the plugin reads it: after a SIGKILL it
			// is in the checkpoint's journal, not yet in a record file.
			if rec, err := checkpoint.Peek(filepath.Join(tc.node.dir(), "facet-state", "claims"), claim.UID); rec == nil || err != nil {
				t.Errorf("earlier claim no longer prepared: checkpoint record %v, %v", rec, err)
			}
			if _, err := os.Stat(filepath.Join(tc.node.dir(), "cdi", "gpu.facet.dev-claim_"+string(claim.UID)+".json")); err != nil {
				t.Errorf("earlier claim no longer prepared: %v", err)
			}

			createPod(t, ns, "after", landsOn[tc.node.name], nil)
			for _, d := range checkOn(t, waitRunning(t, ns, "after"), tc.node.name) {
				// Whole GPUs and MIG placements both hold one claim at a time.
				if slices.Contains(beforeDevices, d) {
					t.Errorf("new pod got %s, which the earlier pod holds", d)
				}
			}
			checkSlicesUnchanged(t, slicesBefore, sliceVersions(t, others))
		})
	}
}

// sliceVersions maps each of the nodes' ResourceSlices to its UID and a
// digest of its spec less each device's migInUse: that attribute follows
// the node's own MIG claims (a pod carved on node-h100 while another node's
// plugin is down republishes it), which is not the churn these tests look
// for: a slice recreated, or its devices rewritten.
func sliceVersions(t testing.TB, nodes []gpuNode) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, n := range nodes {
		for _, s := range slicesOf(t, n.name) {
			spec := s.Spec.DeepCopy()
			for i := range spec.Devices {
				delete(spec.Devices[i].Attributes, "migInUse")
			}
			data, err := json.Marshal(spec)
			if err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(data)
			out[s.Name] = string(s.UID) + "@" + hex.EncodeToString(sum[:8])
		}
	}
	return out
}

func checkSlicesUnchanged(t testing.TB, before, now map[string]string) {
	t.Helper()
	if len(before) == 0 {
		t.Fatal("no slices to compare")
	}
	for name, v := range before {
		if now[name] != v {
			t.Errorf("slice %s changed: %s, was %s", name, now[name], v)
		}
	}
	for name := range now {
		if _, ok := before[name]; !ok {
			t.Errorf("new slice %s", name)
		}
	}
}

// processRuns reports whether pid is a live process (not a zombie).
func processRuns(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// "pid (comm) S ...": the state follows the last ')'.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
