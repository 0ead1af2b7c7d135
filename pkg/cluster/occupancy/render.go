package occupancy

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"sigs.k8s.io/yaml"

	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/model/sharemem"
)

// Table writes one row per GPU and one more per further holder:
//
//	NODE       GPU    MODE    HEALTH  MEMORY ALLOCATED   SM ALLOCATED  HELD BY
//	node-1     gpu-0  mig     ok      9.75Gi of 79.2Gi   16%      default/a: gpu-0-mig-1g10gb-6 (1g.10gb, slice 6)
//
// A vGPU share or slot also shows how much of it a workload can allocate
// under HAMi-core (sharemem.Usable), and a note under the table names where
// that figure comes from.
func Table(w io.Writer, c *Cluster) error {
	if err := table(w, c); err != nil {
		return err
	}
	if err := timeSliced(w, c); err != nil {
		return err
	}
	for _, g := range c.GPUs {
		if len(g.Shares) > 0 || len(g.Slots) > 0 {
			_, err := fmt.Fprintf(w, "\nusable: a vGPU share's or slot's memory less the CUDA context HAMi-core charges to it,\n"+
				"about %d MiB (%s);\nwhere MPS serves the share (\"MPS\") the context is smaller, %d MiB plus the share's percentage of the rest\n"+
				"(%d MiB at 20 %%, measured on an H200). Request that much more than the workload needs.\n",
				sharemem.ContextChargeBytes>>20, sharemem.ContextChargeSource, sharemem.MPSContextBaseBytes>>20, sharemem.MPSContextChargeBytes(20)>>20)
			return err
		}
	}
	return nil
}

// timeSliced lists the GPUs whose shares and slots are only time-sliced:
// their cores are not held (HAMi-core's throttle does not hold GEMMs), the
// shipped vgpu classes leave them out, and the node's Event says why.
func timeSliced(w io.Writer, c *Cluster) error {
	var gpus []string
	for _, g := range c.GPUs {
		if g.Compute == names.PartitioningTimeSliced {
			gpus = append(gpus, g.Node+"/"+g.Name())
		}
	}
	if len(gpus) == 0 {
		return nil
	}
	_, err := fmt.Fprintf(w, "\ntime-sliced, not MPS-partitioned: %s.\n"+
		"Their shares' and slots' cores are best effort; vgpu.facet.dev and vgpu-slot.facet.dev leave them out, the\n"+
		"best-effort classes take them. Why: the node's FacetSharingMechanismUnavailable Event (MPS off or facet-mps down).\n",
		strings.Join(gpus, ", "))
	return err
}

func table(w io.Writer, c *Cluster) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tGPU\tMODE\tHEALTH\tMEMORY ALLOCATED\tSM ALLOCATED\tHELD BY")
	for _, g := range c.GPUs {
		held := holdings(g)
		if len(held) == 0 {
			held = []string{"-"}
		}
		health := g.Health
		if g.HealthReason != "" {
			health += " (" + g.HealthReason + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Node, g.Name(), g.Mode, health,
			fmt.Sprintf("%s of %s", gib(g.Memory.Used), gib(g.Memory.Total)), fmt.Sprintf("%d%%", g.Cores.Used), held[0])
		for _, h := range held[1:] {
			fmt.Fprintf(tw, "\t\t\t\t\t\t%s\n", h)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := domains(w, c); err != nil {
		return err
	}
	if err := cliques(w, c); err != nil {
		return err
	}
	return computeDomains(w, c)
}

// cliques lists the NVLink fabric cliques of the nodes' IMEX channels,
// with the nodes whose channel no claim holds: a ComputeDomain of n nodes
// needs a clique with n free.
func cliques(w io.Writer, c *Cluster) error {
	noClique := 0
	for _, ch := range c.Channels {
		if ch.Clique == "" {
			noClique++
		}
	}
	if len(c.Cliques) == 0 && noClique == 0 {
		return nil
	}
	if _, err := fmt.Fprintln(w, "\nNVLink fabric cliques (IMEX channels, one per node; a ComputeDomain runs in one clique):"); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, q := range c.Cliques {
		free := strings.Join(q.Free, " ")
		if free == "" {
			free = "none"
		}
		fmt.Fprintf(tw, "  %s\t%d of %d channels free\t%s\n", q.Name, len(q.Free), len(q.Nodes), free)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if noClique > 0 {
		_, err := fmt.Fprintf(w, "  and %d channel(s) without fabricClusterUUID and fabricCliqueID, in no clique\n", noClique)
		return err
	}
	return nil
}

// computeDomains lists the ComputeDomains: the clique each is pinned to
// and how many of its nodes' IMEX daemons are ready of numNodes.
func computeDomains(w io.Writer, c *Cluster) error {
	if len(c.Domains) == 0 {
		return nil
	}
	if _, err := fmt.Fprintln(w, "\nCompute domains (IMEX daemons ready of numNodes):"); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  DOMAIN\tCLIQUE\tREADY\tSTATUS\tNODES")
	for _, d := range c.Domains {
		clique := d.Clique
		if clique == "" {
			clique = "-"
		}
		status := d.Status
		if status == "" {
			status = "-"
		}
		if d.Deleting {
			status += ", deleted: waiting for its pods"
		}
		if d.Why != "" {
			status += ": " + d.Why
		}
		nodes := "-"
		if len(d.Nodes) > 0 {
			ready := map[string]bool{}
			for _, n := range d.Ready {
				ready[n] = true
			}
			parts := make([]string, len(d.Nodes))
			for i, n := range d.Nodes {
				parts[i] = n
				if !ready[n] {
					parts[i] += " (not ready)"
				}
			}
			nodes = strings.Join(parts, ", ")
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d/%d\t%s\t%s\n", d, clique, len(d.Ready), d.NumNodes, status, nodes)
	}
	return tw.Flush()
}

// domains lists each node's NVLink domains (the nvlinkDomain attribute)
// with the GPUs of each that hold nothing, so that a domain broken up by
// small claims shows before a multi-GPU job waits on it. Nothing on
// nodes without NVLink.
func domains(w io.Writer, c *Cluster) error {
	type domain struct {
		node, name string
		gpus, idle []string
	}
	var out []*domain
	byKey := map[string]*domain{}
	for _, g := range c.GPUs {
		name := ""
		for _, dn := range g.Devices {
			if d, ok := c.Device(g.Node, dn); ok {
				if name = d.Attr("nvlinkDomain"); name != "" {
					break
				}
			}
		}
		if name == "" {
			continue
		}
		k := g.Node + "/" + name
		d := byKey[k]
		if d == nil {
			d = &domain{node: g.Node, name: name}
			byKey[k] = d
			out = append(out, d)
		}
		d.gpus = append(d.gpus, g.Name())
		if idle(g) {
			d.idle = append(d.idle, g.Name())
		}
	}
	if len(out) == 0 {
		return nil
	}
	if _, err := fmt.Fprintln(w, "\nNVLink domains (GPUs holding nothing, for a multi-GPU claim aligned on gpu.facet.dev/nvlinkDomain):"); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, d := range out {
		idle := strings.Join(d.idle, " ")
		if idle == "" {
			idle = "none"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d of %d GPUs free\t%s\n", d.node, d.name, len(d.idle), len(d.gpus), idle)
	}
	return tw.Flush()
}

// holdings describes what each claim holds on a GPU, one line each.
func holdings(g *GPU) []string {
	var out []string
	if g.Whole != nil {
		out = append(out, g.Whole.String()+": whole GPU")
	}
	for _, m := range g.MIG {
		where := fmt.Sprintf("slice %d", m.Start)
		if m.Size > 1 {
			where = fmt.Sprintf("slices %d-%d", m.Start, m.Start+m.Size-1)
		}
		out = append(out, fmt.Sprintf("%s: %s (%s, %s)", m.Claim, m.Device, m.Profile, where))
	}
	for _, s := range g.Shares {
		out = append(out, fmt.Sprintf("%s: share %s of %s (%s, %s; %s)", s.Claim, s.ShareID, s.Device, gib(s.MemoryBytes), cores(s.Cores), usable(s.MemoryBytes, s.Cores, s.MPS)))
	}
	for _, s := range g.Slots {
		if s.Claim != nil {
			out = append(out, fmt.Sprintf("%s: %s (%s, %s; %s)", s.Claim, s.Device, gib(s.MemoryBytes), cores(s.Cores), usable(s.MemoryBytes, s.Cores, s.MPS)))
		}
	}
	if n := freeSlots(g); n > 0 {
		out = append(out, fmt.Sprintf("%d of %d slots free", n, len(g.Slots)))
	}
	return out
}

func freeSlots(g *GPU) int {
	n := 0
	for _, s := range g.Slots {
		if s.Claim == nil {
			n++
		}
	}
	return n
}

// barCells is the width of a memory bar of a GPU without memory slices.
const barCells = 16

// Bar draws a GPU's memory: one character per memory slice where it has
// MIG (the claim's letter, '.' free, '~' kept from MIG by vGPU shares,
// ' ' no instance there); else barCells cells of memory, each holder's part
// in proportion (at least one cell). letter names claims.
func Bar(g *GPU, letter func(Claim) string) string {
	var b strings.Builder
	b.WriteByte('[')
	switch {
	case len(g.Devices) == 0:
		return "[?]" // absent: nothing published to draw
	case g.MemorySlices != nil:
		for _, h := range g.MemorySlices {
			switch h {
			case "":
				b.WriteByte('.')
			case SharesHold:
				b.WriteByte('~')
			case NoInstance:
				b.WriteByte(' ')
			default:
				ns, name, _ := strings.Cut(h, "/")
				b.WriteString(letter(Claim{Namespace: ns, Name: name}))
			}
		}
	case len(g.Slots) > 0:
		// One segment per slot, '|' between slots, so free slots show.
		for i, s := range g.Slots {
			if i > 0 {
				b.WriteByte('|')
			}
			ch := "."
			if s.Claim != nil {
				ch = letter(*s.Claim)
			}
			b.WriteString(strings.Repeat(ch, cells(s.MemoryBytes, g.Memory.Total)))
		}
	default:
		used := 0
		if g.Whole != nil {
			b.WriteString(strings.Repeat(letter(*g.Whole), barCells))
			used = barCells
		}
		for _, s := range g.Shares {
			n := min(cells(s.MemoryBytes, g.Memory.Total), barCells-used)
			b.WriteString(strings.Repeat(letter(s.Claim), n))
			used += n
		}
		for _, m := range g.MIG { // a MIG GPU whose table is unknown
			n := min(cells(m.MemoryBytes, g.Memory.Total), barCells-used)
			b.WriteString(strings.Repeat(letter(m.Claim), n))
			used += n
		}
		b.WriteString(strings.Repeat(".", barCells-used))
	}
	b.WriteByte(']')
	return b.String()
}

// cells is part's share of barCells, at least one.
func cells(part, total int64) int {
	if total <= 0 {
		return 1
	}
	return max(int((part*barCells+total/2)/total), 1)
}

// Picture draws each node's GPUs as bars, with a legend of claims.
func Picture(w io.Writer, c *Cluster) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for i, node := range c.Nodes() {
		if i > 0 {
			fmt.Fprintln(tw)
		}
		fmt.Fprintf(tw, "%s\n", node)
		letters := map[Claim]string{}
		var legend []string
		letter := func(cl Claim) string {
			if l, ok := letters[cl]; ok {
				return l
			}
			l := symbol(len(letters))
			letters[cl] = l
			legend = append(legend, l+" "+cl.String())
			return l
		}
		for _, g := range c.GPUs {
			if g.Node != node {
				continue
			}
			bar := Bar(g, letter)
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", g.Name(), g.Mode, bar, summary(g))
		}
		if len(legend) > 0 {
			fmt.Fprintf(tw, "  %s\n", strings.Join(legend, "   "))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// Cliques and domains span nodes: after them, as in the table.
	if err := cliques(w, c); err != nil {
		return err
	}
	return computeDomains(w, c)
}

// symbol is the n-th claim's letter: A-Z, a-z, 0-9, then '*'.
func symbol(n int) string {
	const s = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	if n < len(s) {
		return s[n : n+1]
	}
	return "*"
}

// summary is the words beside a GPU's bar.
func summary(g *GPU) string {
	var parts []string
	if g.Health != HealthOK {
		parts = append(parts, strings.ToUpper(g.Health)+": "+g.HealthReason)
	}
	switch {
	case g.MemorySlices != nil:
		parts = append(parts, fmt.Sprintf("%d of %d memory slices free", g.FreeSlices(), len(g.MemorySlices)))
	case len(g.Slots) > 0:
		parts = append(parts, fmt.Sprintf("%d of %d slots free", freeSlots(g), len(g.Slots)))
	}
	parts = append(parts, fmt.Sprintf("%s of %s memory free, %d%% SM free", gib(g.Memory.Free()), gib(g.Memory.Total), g.Cores.Free()))
	return strings.Join(parts, "; ")
}

// YAML writes the model.
func YAML(w io.Writer, c *Cluster) error {
	out, err := yaml.Marshal(c)
	if err != nil {
		return err
	}
	_, err = w.Write(out)
	return err
}

// gib formats bytes in GiB, one decimal where it matters.
func gib(b int64) string {
	v := float64(b) / (1 << 30)
	if b == 0 {
		return "0"
	}
	if v == float64(int64(v)) {
		return fmt.Sprintf("%dGi", int64(v))
	}
	if v < 10 {
		return fmt.Sprintf("%.2fGi", v)
	}
	return fmt.Sprintf("%.1fGi", v)
}

func cores(pct int64) string {
	if pct == 0 {
		return "best-effort SM"
	}
	return fmt.Sprintf("%d%%", pct)
}

// usable is what a workload can allocate of a share's memory: less the
// CUDA context HAMi-core charges to it, an MPS client's smaller one where
// MPS serves the share at cores percent.
func usable(memoryBytes, cores int64, mps bool) string {
	if mps {
		return gib(sharemem.UsableMPS(memoryBytes, cores)) + " usable, MPS"
	}
	return gib(sharemem.Usable(memoryBytes)) + " usable"
}

// idle says whether no claim holds any part of g.
func idle(g *GPU) bool {
	if g.Whole != nil || len(g.MIG) > 0 || len(g.Shares) > 0 {
		return false
	}
	for _, s := range g.Slots {
		if s.Claim != nil {
			return false
		}
	}
	return true
}
