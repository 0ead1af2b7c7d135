package inventory

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
)

// ModeFlags are the command-line flags that choose GPU modes. The plugin
// and facetctl share them so both read a node the same way.
type ModeFlags struct {
	Default     string
	PerGPU      string
	Order       string
	Slots       string
	PerGPUSlots string
}

// Register adds --mode, --gpu-modes and --gpu-order to fs.
func (f *ModeFlags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.Default, "mode", string(ModeAuto), fmt.Sprintf("mode of every GPU without a --gpu-modes entry, one of %v; %s", Modes, AutoPolicy()))
	fs.StringVar(&f.PerGPU, "gpu-modes", "", `per-GPU modes by NVML index, e.g. "0-3=mig,4-7=exclusive"`)
	fs.StringVar(&f.Slots, "slots", DefaultSlotLayout.String(), `slot layout of every slots-mode GPU without a --gpu-slots entry: groups joined by "+", each COUNT (equal parts) or COUNTxMEMORY/PERCENT, e.g. "4x20Gi/25"`)
	fs.StringVar(&f.PerGPUSlots, "gpu-slots", "", `per-GPU slot layouts by NVML index, e.g. "4-7=2x10Gi/10+1x40Gi/50"`)
	fs.StringVar(&f.Order, "gpu-order", string(OrderBinpack), fmt.Sprintf("order of the GPUs sharing a ResourceSlice, one of %v: binpack fills one GPU before the next, spread makes equal MIG claims take turns, profile packs equal MIG claims node-wide (one slice per MIG profile) but gives up best fit across profiles", Orders))
}

// Config parses the flags. Errors name the flag and the bad entry.
func (f *ModeFlags) Config() (Config, error) {
	if f.Default == "" {
		f.Default = string(ModeAuto)
	}
	if f.Order == "" {
		f.Order = string(OrderBinpack)
	}
	def, err := ParseMode(f.Default)
	if err != nil {
		return Config{}, fmt.Errorf("--mode: %w", err)
	}
	per, err := ParsePerGPUModes(f.PerGPU)
	if err != nil {
		return Config{}, fmt.Errorf("--gpu-modes: %w", err)
	}
	order, err := ParseOrder(f.Order)
	if err != nil {
		return Config{}, fmt.Errorf("--gpu-order: %w", err)
	}
	cfg := Config{DefaultMode: def, PerGPU: per, Order: order}
	if f.Slots != "" {
		if cfg.DefaultSlots, err = ParseSlotLayout(f.Slots); err != nil {
			return Config{}, fmt.Errorf("--slots: %w", err)
		}
	}
	if cfg.PerGPUSlots, err = ParsePerGPU(f.PerGPUSlots, "layout", ParseSlotLayout); err != nil {
		return Config{}, fmt.Errorf("--gpu-slots: %w", err)
	}
	return cfg, nil
}

// ParsePerGPUModes parses "0-3=mig,4=exclusive,5-7=shared".
func ParsePerGPUModes(s string) (map[int]Mode, error) { return ParsePerGPU(s, "mode", ParseMode) }

// ParsePerGPU parses per-GPU values, "0-3=A,4=B,5-7=C", each value by
// parse; what names the value in errors ("INDEX[-INDEX]=MODE").
func ParsePerGPU[T any](s, what string, parse func(string) (T, error)) (map[int]T, error) {
	out := map[int]T{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, entry := range strings.Split(s, ",") {
		rng, name, ok := strings.Cut(strings.TrimSpace(entry), "=")
		if !ok {
			return nil, fmt.Errorf("%q: want INDEX[-INDEX]=%s", entry, strings.ToUpper(what))
		}
		mode, err := parse(name)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", entry, err)
		}
		lo, hi, isRange := strings.Cut(rng, "-")
		first, err1 := strconv.Atoi(lo)
		last := first
		var err2 error
		if isRange {
			last, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || first < 0 || last < first {
			return nil, fmt.Errorf("%q: %q is not an index or range like 0-3", entry, rng)
		}
		for i := first; i <= last; i++ {
			if prev, dup := out[i]; dup {
				return nil, fmt.Errorf("%q: GPU %d already set to %v", entry, i, prev)
			}
			out[i] = mode
		}
	}
	return out, nil
}
