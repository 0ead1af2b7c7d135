package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/node/gpuhealth"
)

// defaultStateDir is the demo node's plugin state directory:
// $FACET_STATE_DIR, else <defaultRunDir()>/facet-state (hack/plugin.sh).
func defaultStateDir() string {
	if d := os.Getenv("FACET_STATE_DIR"); d != "" {
		return d
	}
	return filepath.Join(defaultRunDir(), "facet-state")
}

// runFault injects faults into, or clears them from, a simulated node
// whose plugin runs with --machine (sim.WithFaultFile).
func runFault(args []string) error {
	if len(args) == 0 || (args[0] != "inject" && args[0] != "clear") {
		return fmt.Errorf("want 'fault inject' or 'fault clear'")
	}
	fs := flag.NewFlagSet("fault "+args[0], flag.ExitOnError)
	stateDir := fs.String("state-dir", defaultStateDir(), "the simulated node's plugin --state-dir")
	gpu := fs.String("gpu", "", "NVML index of the GPU (clear: or \"all\")")
	kind := fs.String("kind", string(sim.FaultXID), fmt.Sprintf("inject: what fails, one of %v: xid delivers one XID event, ecc-dbe one double-bit ECC event, lost an XID 79 and every query failing until cleared, query failing queries until cleared", sim.FaultKinds))
	xid := fs.Uint64("xid", 79, "inject --kind xid: the XID number (79: fallen off the bus; 48: double-bit ECC; 13: an application error, which is not a fault)")
	fs.Parse(args[1:])
	path := filepath.Join(*stateDir, sim.FaultFileName)
	gpus, err := simulatedGPUs(*stateDir)
	if err != nil {
		return err
	}
	if args[0] == "clear" {
		index := -1
		if *gpu != "all" {
			if index, err = strconv.Atoi(*gpu); err != nil {
				return fmt.Errorf("--gpu %q: want an NVML index or \"all\"", *gpu)
			}
		}
		n, err := sim.ClearFaults(path, index)
		if err != nil {
			return err
		}
		fmt.Printf("cleared %d fault(s): the simulated GPU answers NVML again, as after a reset\n", n)
		return nil
	}
	index, err := strconv.Atoi(*gpu)
	if err != nil {
		return fmt.Errorf("--gpu %q: want an NVML index", *gpu)
	}
	f := sim.Fault{GPU: index, Kind: sim.FaultKind(*kind)}
	if f.Kind == sim.FaultXID {
		f.XID = *xid
	}
	f, err = sim.InjectFault(path, gpus, f)
	if err != nil {
		return err
	}
	out, _ := json.Marshal(f)
	fmt.Printf("injected %s into %s\n", out, path)
	return nil
}

// simulatedGPUs counts the GPUs of the simulated node from its NVML state
// file, so an injected fault never names a GPU the node lacks.
func simulatedGPUs(stateDir string) (int, error) {
	data, err := os.ReadFile(filepath.Join(stateDir, "simulated-nvml.json"))
	if err != nil {
		return 0, fmt.Errorf("%s is not the state directory of a simulated node's running plugin (--state-dir): %w", stateDir, err)
	}
	var st struct {
		GPUs []json.RawMessage `json:"gpus"`
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return 0, fmt.Errorf("simulated NVML state: %w", err)
	}
	return len(st.GPUs), nil
}

// runHealth asks a node's plugin to recover GPUs: it sets the Node
// annotation names.AnnotationRecover, keeping other GPUs' requests.
func runHealth(args []string) error {
	if len(args) == 0 || args[0] != "recover" {
		return fmt.Errorf("want 'health recover'")
	}
	fs := flag.NewFlagSet("health recover", flag.ExitOnError)
	kube := kubeFlag(fs)
	node := fs.String("node", "", "the node (required)")
	gpu := fs.String("gpu", "", "the GPU's UUID, NVML index, or \"all\" (required)")
	fs.Parse(args[1:])
	if *node == "" || *gpu == "" {
		return fmt.Errorf("--node and --gpu are required")
	}
	client, err := kube.Client()
	if err != nil {
		return err
	}
	ctx := context.Background()
	n, err := client.CoreV1().Nodes().Get(ctx, *node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	var reqs []gpuhealth.RecoverRequest
	if old, ok := n.Annotations[names.AnnotationRecover]; ok {
		// A malformed old value is replaced, not kept.
		prev, _ := gpuhealth.ParseRecoverRequests(old)
		for _, r := range prev {
			if r.GPU != *gpu {
				reqs = append(reqs, r)
			}
		}
	}
	reqs = append(reqs, gpuhealth.RecoverRequest{GPU: *gpu, At: time.Now().UTC()})
	if _, err := gpuhealth.ParseRecoverRequests(gpuhealth.FormatRecoverRequests(reqs[len(reqs)-1:])); err != nil {
		return fmt.Errorf("--gpu: %w", err)
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{names.AnnotationRecover: gpuhealth.FormatRecoverRequests(reqs)}}})
	if _, err := client.CoreV1().Nodes().Patch(ctx, *node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return err
	}
	fmt.Printf("asked %s's Facet plugin to recover GPU %s; it does if the GPU answers NVML and had no fault since: watch `kubectl get events --field-selector involvedObject.name=%s`\n", *node, *gpu, *node)
	return nil
}
