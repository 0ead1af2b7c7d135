package imex

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

// golden compares got with testdata/name, or writes it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	p := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(p, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if string(got) != string(want) {
		t.Errorf("%s differs:\n--- got\n%s\n--- want\n%s", p, got, want)
	}
}

func TestRenderConfig(t *testing.T) {
	for _, tc := range []struct {
		name    string
		data    ConfigData
		golden  string
		wantErr string
	}{
		{name: "IPv4, state dir in the chroot", golden: "imexd-ipv4.cfg",
			data: ConfigData{Domain: "ml/train (0b7d2c1e-8d43-4f0e-9a51-6f3b2a1c9d80)", StateDir: ChrootStateDir, CmdBindIP: "10.0.3.11"}},
		{name: "IPv6", golden: "imexd-ipv6.cfg",
			data: ConfigData{Domain: "ml/train (0b7d2c1e-8d43-4f0e-9a51-6f3b2a1c9d80)", StateDir: ChrootStateDir, CmdBindIP: "fd00::3:11"}},
		{name: "no bind address", data: ConfigData{Domain: "ml/train (u)", StateDir: ChrootStateDir}, wantErr: `command bind address ""`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := RenderConfig(tc.data)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// The settings NVIDIA's template fixes, whatever the comments say.
			for _, line := range []string{"DAEMONIZE=0", "SERVER_PORT=50000", "IMEX_CMD_PORT=50005", "IMEX_WAIT_FOR_QUORUM=RECOVERY",
				"IMEX_NODE_CONFIG_FILE=" + tc.data.StateDir + "/nodes.cfg", "IMEX_CMD_BIND_INTERFACE_IP=" + tc.data.CmdBindIP, "LOG_FILE_NAME="} {
				if !strings.Contains("\n"+string(got), "\n"+line+"\n") {
					t.Errorf("no line %q", line)
				}
			}
			golden(t, tc.golden, got)
		})
	}
}

// node is a status.nodes entry.
func node(name, ip string, index int32) v1alpha1.ComputeDomainNode {
	return v1alpha1.ComputeDomainNode{Name: name, IPAddress: ip, CliqueID: "6f1a2b3c-4d5e-4f60-8a1b-2c3d4e5f6a7b.1", Index: index, Status: v1alpha1.ComputeDomainNotReady}
}

func TestPeerList(t *testing.T) {
	for _, tc := range []struct {
		name     string
		nodes    []v1alpha1.ComputeDomainNode
		numNodes int32
		golden   string
		wantErr  []string
	}{
		{name: "four nodes listed out of order", numNodes: 4, golden: "nodes-four.cfg",
			nodes: []v1alpha1.ComputeDomainNode{node("tray-3", "10.0.3.13", 2), node("tray-1", "10.0.3.11", 0), node("tray-4", "10.0.3.14", 3), node("tray-2", "10.0.3.12", 1)}},
		{name: "a node gone: index 1 missing, the rest keep their order", numNodes: 4, golden: "nodes-gap.cfg",
			nodes: []v1alpha1.ComputeDomainNode{node("tray-1", "10.0.3.11", 0), node("tray-4", "10.0.3.14", 3), node("tray-3", "10.0.3.13", 2)}},
		{name: "IPv6", numNodes: 2, golden: "nodes-ipv6.cfg",
			nodes: []v1alpha1.ComputeDomainNode{node("tray-2", "fd00::3:12", 1), node("tray-1", "fd00::3:11", 0)}},
		{name: "none yet", numNodes: 4, golden: "nodes-empty.cfg"},
		{name: "one address for every node (the simulated rack's)", numNodes: 2, golden: "nodes-shared-address.cfg",
			nodes: []v1alpha1.ComputeDomainNode{node("tray-1", "192.168.7.2", 0), node("tray-2", "192.168.7.2", 1)}},
		{name: "an index twice", numNodes: 4,
			nodes:   []v1alpha1.ComputeDomainNode{node("tray-1", "10.0.3.11", 0), node("tray-2", "10.0.3.12", 0)},
			wantErr: []string{"status.nodes[1].index: Duplicate value", "node tray-2, as status.nodes[0], node tray-1"}},
		{name: "an index out of range", numNodes: 2,
			nodes:   []v1alpha1.ComputeDomainNode{node("tray-1", "10.0.3.11", 2)},
			wantErr: []string{"status.nodes[0].index: Invalid value: 2: node tray-1: must be 0 to spec.numNodes-1 (1)"}},
		{name: "a node twice", numNodes: 4,
			nodes:   []v1alpha1.ComputeDomainNode{node("tray-1", "10.0.3.11", 0), node("tray-1", "10.0.3.11", 1)},
			wantErr: []string{"status.nodes[1].name: Duplicate value"}},
		{name: "not an address", numNodes: 4,
			nodes:   []v1alpha1.ComputeDomainNode{node("tray-1", "tray-1.example", 0), node("tray-2", "", 1)},
			wantErr: []string{`status.nodes[0].ipAddress: Invalid value: "tray-1.example": node tray-1: not an IP address`, `status.nodes[1].ipAddress: Invalid value: ""`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PeerList(tc.nodes, tc.numNodes)
			if len(tc.wantErr) > 0 {
				for _, want := range tc.wantErr {
					if err == nil || !strings.Contains(err.Error(), want) {
						t.Errorf("error %v, want %q", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			golden(t, tc.golden, got)
		})
	}
}

// domain is a ComputeDomain ml/train of numNodes with these status.nodes.
func domain(numNodes int32, nodes ...v1alpha1.ComputeDomainNode) *v1alpha1.ComputeDomain {
	return &v1alpha1.ComputeDomain{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "train", UID: types.UID(testUID), ResourceVersion: "1"},
		Spec:       v1alpha1.ComputeDomainSpec{NumNodes: numNodes, Channel: v1alpha1.ComputeDomainChannelSpec{ResourceClaimTemplate: v1alpha1.ComputeDomainResourceClaimTemplate{Name: "train-channel"}}},
		Status:     v1alpha1.ComputeDomainStatus{Nodes: nodes},
	}
}

const testUID = "0b7d2c1e-8d43-4f0e-9a51-6f3b2a1c9d80"

func TestSimulatedReadiness(t *testing.T) {
	a, b, c, d := node("tray-1", "10.0.3.11", 0), node("tray-2", "10.0.3.12", 1), node("tray-3", "10.0.3.13", 2), node("tray-4", "10.0.3.14", 3)
	for _, tc := range []struct {
		name       string
		domain     *v1alpha1.ComputeDomain
		node       string
		wantReady  bool
		wantReason string
	}{
		{name: "complete", domain: domain(4, d, b, a, c), node: "tray-2", wantReady: true},
		{name: "one node", domain: domain(1, a), node: "tray-1", wantReady: true},
		{name: "three of four", domain: domain(4, a, b, c), node: "tray-1",
			wantReason: "ComputeDomain ml/train: the peer list holds 3 of spec.numNodes 4 nodes (tray-1, tray-2, tray-3)"},
		{name: "this node missing", domain: domain(4, a, b, c), node: "tray-4",
			wantReason: "ComputeDomain ml/train: node tray-4 is not in status.nodes (tray-1, tray-2, tray-3)"},
		{name: "empty", domain: domain(2), node: "tray-1",
			wantReason: "ComputeDomain ml/train: node tray-1 is not in status.nodes (none)"},
		{name: "an index twice", domain: domain(4, a, b, c, node("tray-4", "10.0.3.14", 2)), node: "tray-1",
			wantReason: "ComputeDomain ml/train: status.nodes[3].index: Duplicate value"},
		{name: "an index beyond numNodes", domain: domain(2, a, node("tray-2", "10.0.3.12", 2)), node: "tray-1",
			wantReason: "status.nodes[1].index: Invalid value: 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ready, reason := SimulatedReadiness(tc.domain, tc.node)
			if ready != tc.wantReady || !strings.Contains(reason, tc.wantReason) || (tc.wantReady && reason != "") {
				t.Errorf("SimulatedReadiness = %v %q, want %v %q", ready, reason, tc.wantReady, tc.wantReason)
			}
		})
	}
}
