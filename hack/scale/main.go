// Command scale measures scheduling throughput and latency of Facet's
// slice shapes through a real kube-apiserver and kube-scheduler with
// hundreds of bare Nodes (test/scale), and prints a table. `make
// bench-scale` runs it; it is not part of `make test`.
//
//	go run ./hack/scale -versions v1.35.4=$(hack/build-k8s.sh v1.35.4),v1.37.2=$(hack/build-k8s.sh v1.37.2) -nodes 100,500
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/facet-gpu/facet/pkg/cluster/fit"
	"github.com/facet-gpu/facet/test/scale"
)

func main() {
	var (
		versions = flag.String("versions", "", "VERSION=BINDIR,... : kube-apiserver, kube-scheduler and etcd of each Kubernetes version (hack/build-tools.sh)")
		shapes   = flag.String("shapes", "all", "shapes to run, comma-separated (test/scale Shapes: exclusive, nvidia-exclusive, static-mig, nvidia-static-mig, mig, nvidia-mig, shared, nvidia-shared, slots, nvidia-slots), or all")
		nodes    = flag.String("nodes", "100,500", "node counts")
		pods     = flag.Int("pods", 0, "pods per run; 0: max(500, 2 x nodes), at most what the nodes hold")
		qps      = flag.String("qps", "1000", "scheduler --kube-api-qps values (burst = qps); 0 is the scheduler's default (50/100)")
		timeout  = flag.Duration("timeout", 120*time.Second, "bound on each run's wait for bindings")
		machine  = flag.String("machine", "demo/machines/dgx-h100.yaml", "machine file of every node")
		classes  = flag.String("classes", "deployments/deviceclasses.yaml", "DeviceClasses")
		runDir   = flag.String("run-dir", "/tmp/facet-scale", "state and logs")
		verbose  = flag.Bool("v", false, "progress lines")
	)
	flag.Parse()
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, *versions, *shapes, *nodes, *qps, *pods, *timeout, *machine, *classes, *runDir, *verbose)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, versions, shapeList, nodeList, qpsList string, pods int, timeout time.Duration, machine, classFile, runDir string, verbose bool) error {
	all, err := scale.Shapes(machine)
	if err != nil {
		return err
	}
	_, classes, _, err := fit.ReadFile(classFile)
	if err != nil {
		return err
	}
	var chosen []scale.Shape
	if shapeList == "all" {
		chosen, shapeList = all, ""
	}
	for _, name := range strings.FieldsFunc(shapeList, func(r rune) bool { return r == ',' }) {
		found := false
		for _, s := range all {
			if s.Name == name {
				chosen, found = append(chosen, s), true
			}
		}
		if !found {
			return fmt.Errorf("unknown shape %q", name)
		}
	}
	ns, err := ints(nodeList)
	if err != nil {
		return fmt.Errorf("-nodes: %w", err)
	}
	qs, err := ints(qpsList)
	if err != nil {
		return fmt.Errorf("-qps: %w", err)
	}
	if versions == "" {
		return fmt.Errorf("-versions is required, e.g. v1.35.4=$(hack/build-tools.sh)")
	}
	logf := func(format string, args ...any) {
		if verbose {
			fmt.Fprintf(os.Stderr, "[scale] "+format+"\n", args...)
		}
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "version\tshape\tdriver\tgates\tqps\tnodes\tslices/node\tpods/s\tp50\tp99\tbound/total\tGPUs used/min\tFilter/node\tFilter/pod\tscheduler CPU\tbusy CPUs\tload1\t")
	notes := map[string]string{}
	t0 := time.Now()
	for _, vb := range strings.Split(versions, ",") {
		version, bin, ok := strings.Cut(vb, "=")
		if !ok {
			return fmt.Errorf("-versions: %q is not VERSION=BINDIR", vb)
		}
		for _, shape := range chosen {
			for _, n := range ns {
				for _, q := range qs {
					gates, label := gatesFor(version, shape.Gates)
					qs := strconv.Itoa(q)
					if q == 0 {
						qs = "default"
					}
					if shape.NA != "" {
						notes[shape.Name] = shape.NA
						fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\t%d\t-\tn/a\t-\t-\t-\t-\t-\t-\t-\t-\t-\t\n", version, shape.Family, shape.Driver, n)
						continue
					}
					np := pods
					if np == 0 {
						np = max(500, 2*n)
					}
					np = min(np, n*shape.PerNode)
					fmt.Fprintf(os.Stderr, "[scale %4.0fs] %s %s gates=%s qps=%d nodes=%d pods=%d\n", time.Since(t0).Seconds(), shape.Name, version, label, q, n, np)
					c, err := scale.Start(ctx, scale.Config{BinDir: bin, RunDir: filepath.Join(runDir, "run"), FeatureGates: gates, Ports: scale.DefaultPorts})
					if err != nil {
						return err
					}
					r, err := scale.Run(ctx, c, scale.Params{Shape: shape, Nodes: n, Pods: np, Classes: classes, QPS: q, Burst: q, Timeout: timeout, Log: logf})
					c.Stop()
					if err != nil {
						return fmt.Errorf("%s %s nodes=%d: %w (logs: %s)", shape.Name, version, n, err, filepath.Join(runDir, "run", "logs"))
					}
					line := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%d\t%d\t%.1f\t%.2fs\t%.2fs\t%d/%d\t%d/%d\t%s\t%s\t%.2f\t%.2f/%d\t%.1f\t", version, shape.Family, shape.Driver, label, qs, n, r.SlicesPerNode,
						r.PodsPerSecond, r.P50.Seconds(), r.P99.Seconds(), r.Bound, r.Pods, r.GPUsUsed, r.GPUsMin, duration(r.FilterPerNode), duration(r.FilterPerPod),
						r.CPU.Share(r.CPU.Scheduler), r.CPU.Share(r.CPU.Busy), r.CPU.Cores, r.CPU.Load1)
					fmt.Fprintln(tw, line)
					fmt.Fprintf(os.Stderr, "[scale %4.0fs]   %s (apiserver %.2f, etcd %.2f, harness %.2f CPUs over %s)\n", time.Since(t0).Seconds(), strings.ReplaceAll(line, "\t", " "),
						r.CPU.Share(r.CPU.APIServer), r.CPU.Share(r.CPU.Etcd), r.CPU.Share(r.CPU.Harness), r.CPU.Wall.Round(time.Second))
				}
			}
		}
	}
	fmt.Fprintf(os.Stderr, "[scale] table done in %s\n", time.Since(t0).Round(time.Second))
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range chosen {
		if notes[s.Name] != "" {
			fmt.Printf("n/a: %s %s: %s\n", s.Family, s.Driver, notes[s.Name])
		}
	}
	fmt.Println("scheduler CPU: CPUs the kube-scheduler used from the first pod to the last binding (or the timeout); busy CPUs: the whole machine's, every process counted; load1: at the end")
	return nil
}

// duration is a Filter time for the table, "-" when the scheduler reported none.
func duration(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return d.Round(10 * time.Microsecond).String()
}

// gatesFor is the --feature-gates of a version for a shape's "on" or
// "stock", and the table's label. 1.35 needs the DRA alpha gates turned on;
// later versions run with their defaults (1.36 turns partitionable devices
// and consumable capacity on).
func gatesFor(version, want string) (gates, label string) {
	if !strings.HasPrefix(version, "v1.35.") {
		return "", "default"
	}
	if want == "on" {
		return scale.GatesOn, "on"
	}
	return "", "stock"
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}
