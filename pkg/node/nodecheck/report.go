package nodecheck

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// shareSlack is how far, in percentage points of the whole GPU's
// throughput, a share's compute may run above its SM share before the
// check calls it not held: HAMi-core throttles by tokens per grid block
// over a sliding window, not exactly.
const shareSlack = 10

// mpsSMSlack is how many SMs above its percentage of the whole GPU's an
// MPS client may see: MPS rounds the percentage to whole SMs (or TPCs).
const mpsSMSlack = 2

// judge fills a row's Problems and Notes from its probe result.
func judge(row *Row) {
	p := row.Probe
	if p == nil || row.ProbeErr != nil {
		return
	}
	problem := func(f string, a ...any) { row.Problems = append(row.Problems, fmt.Sprintf(f, a...)) }
	note := func(f string, a ...any) { row.Notes = append(row.Notes, fmt.Sprintf(f, a...)) }
	if p.Devices != 1 {
		problem("the process sees %d GPUs, not the claim's one", p.Devices)
	}
	switch {
	case p.TotalMiB < row.PublishedMiB:
		problem("the process sees %d MiB in all, %d MiB less than the %d MiB published", p.TotalMiB, row.PublishedMiB-p.TotalMiB, row.PublishedMiB)
	case p.TotalMiB > row.PublishedMiB:
		problem("the process sees %d MiB in all, more than the %d MiB published", p.TotalMiB, row.PublishedMiB)
	}
	if p.LargestAllocMiB > row.PublishedMiB {
		problem("one allocation of %d MiB succeeded, more than the %d MiB published", p.LargestAllocMiB, row.PublishedMiB)
	} else if p.LargestAllocMiB < row.PublishedMiB {
		why := "the CUDA context and the driver's own allocations take the rest"
		if row.Claim != ClaimWhole {
			why = "HAMi-core charges the process's CUDA context to the limit"
		}
		note("a workload can allocate at most %d MiB of the %d MiB (%.0f %%): %s", p.LargestAllocMiB, row.PublishedMiB, 100*float64(p.LargestAllocMiB)/float64(row.PublishedMiB), why)
	}
	if pct, err := strconv.Atoi(row.MPSPercent); err == nil && row.WholeSMs > 0 && p.Multiprocessors > 0 {
		// Under MPS, CUDA reports the client's own SMs: 26 of 132 at
		// 20 % on the H100 (shared/hardware/h100-80gb-hbm3.md). All of
		// them mean the client reached no MPS server and runs
		// unpartitioned, with HAMi-core's SM limit 0.
		want := pct * row.WholeSMs / 100
		if p.Multiprocessors > want+mpsSMSlack {
			problem("as an MPS client at %d %% it sees %d of the GPU's %d SMs, want about %d: it runs without MPS, unpartitioned", pct, p.Multiprocessors, row.WholeSMs, want)
		} else {
			note("as an MPS client at %d %% it sees %d of the GPU's %d SMs", pct, p.Multiprocessors, row.WholeSMs)
		}
	}
	if p.PastLimit.Error == "" {
		problem("an allocation of %d MiB, past the %d MiB published, succeeded: the limit is not enforced", p.PastLimit.RequestMiB, row.PublishedMiB)
	}
	if row.Share > 0 && row.Cores > 0 && row.Cores < 100 {
		pct := 100 * row.Share
		switch {
		case pct > float64(row.Cores+shareSlack):
			problem("its kernel ran at %.0f %% of the whole GPU's throughput, above its %d %% of SM time", pct, row.Cores)
		case pct < float64(row.Cores)/2:
			note("its kernel ran at %.0f %% of the whole GPU's throughput, well below its %d %% of SM time", pct, row.Cores)
		}
	}
}

// WriteTable prints the report: a table of the claims, then each claim's
// errors, problems and notes, then what was left behind.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "CLAIM\tDEVICE\tPUBLISHED\tHAMI-CORE LIMIT\tPROCESS SEES\tLARGEST ALLOC\tPAST THE LIMIT\tCOMPUTE\tRESULT\n")
	for _, row := range r.Rows {
		published := "-"
		if row.PublishedMiB > 0 {
			published = fmt.Sprintf("%d MiB, %s SM", row.PublishedMiB, cores(row.Cores))
		}
		limit := "none"
		switch {
		case row.MPSPercent != "":
			limit = fmt.Sprintf("%s, MPS %s %%", orDefault(row.LimitMemory, "-"), row.MPSPercent)
		case row.LimitMemory != "" || row.LimitSM != "":
			limit = fmt.Sprintf("%s, SM %s", orDefault(row.LimitMemory, "-"), orDefault(row.LimitSM, "-"))
		case row.CDIDevices == nil:
			limit = "-"
		}
		sees, largest, past, compute := "-", "-", "-", "-"
		if p := row.Probe; p != nil {
			sees = fmt.Sprintf("%d MiB (%d free)", p.TotalMiB, p.FreeMiB)
			largest = fmt.Sprintf("%d MiB", p.LargestAllocMiB)
			past = fmt.Sprintf("%d MiB: %s", p.PastLimit.RequestMiB, orDefault(p.PastLimit.Error, "ALLOCATED"))
			if c := p.Compute; c != nil {
				compute = fmt.Sprintf("%.1f TFLOP/s", c.TFLOPS)
				if row.Claim != ClaimWhole && row.Share > 0 {
					compute += fmt.Sprintf(" = %.0f %% (holds %s)", 100*row.Share, cores(row.Cores))
				}
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", row.Claim, orDefault(row.Device, "-"), published, limit, sees, largest, past, compute, row.result())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var b strings.Builder
	// One skip reason for every claim (a simulated node) is said once.
	skipped := ""
	if len(r.Rows) > 0 {
		skipped = r.Rows[0].Skipped
	}
	for _, row := range r.Rows {
		if row.Skipped != skipped {
			skipped = ""
		}
	}
	if skipped != "" {
		fmt.Fprintf(&b, "  CUDA probe skipped for every claim: %s\n", skipped)
	}
	for _, row := range r.Rows {
		line := func(label string, v any) { fmt.Fprintf(&b, "  %s %s: %v\n", row.Claim, label, v) }
		if row.PrepareErr != nil {
			line("prepare failed", row.PrepareErr)
		}
		for _, m := range row.Missing {
			line("spec names a path that does not exist", m)
		}
		if row.ProbeErr != nil {
			line("CUDA probe failed", row.ProbeErr)
		}
		if row.Skipped != "" && skipped == "" {
			line("CUDA probe skipped", row.Skipped)
		}
		for _, p := range row.Problems {
			line("PROBLEM", p)
		}
		for _, n := range row.Notes {
			line("note", n)
		}
		if row.UnprepareErr != nil {
			line("unprepare failed", row.UnprepareErr)
		}
	}
	if b.Len() > 0 {
		fmt.Fprintf(w, "\n%s", b.String())
	}
	if len(r.Leftovers) == 0 {
		fmt.Fprintf(w, "\nLeft nothing behind: no CDI spec, checkpoint record or HAMi-core region remains.\n")
	} else {
		fmt.Fprintf(w, "\nLEFT BEHIND (in %s):\n", r.Scratch)
		for _, l := range r.Leftovers {
			fmt.Fprintf(w, "  %s\n", l)
		}
	}
	return nil
}

// result is a row's one-word verdict.
func (row *Row) result() string {
	switch {
	case row.PrepareErr != nil:
		return "FAILED (prepare)"
	case row.UnprepareErr != nil:
		return "FAILED (unprepare)"
	case len(row.Missing) > 0:
		return "FAILED (spec)"
	case row.ProbeErr != nil:
		return "FAILED (probe)"
	case len(row.Problems) > 0:
		return "PROBLEM"
	case row.Skipped != "":
		return "prepared, probe skipped"
	}
	return "ok"
}

func cores(c int64) string {
	if c == 0 {
		return "best-effort"
	}
	return fmt.Sprintf("%d %%", c)
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
