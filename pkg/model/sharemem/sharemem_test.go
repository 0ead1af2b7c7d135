package sharemem

import "testing"

// TestUsable: a share holds its size less the CUDA context HAMi-core
// charges to it (518 MiB measured on the H100), never less than nothing.
func TestUsable(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct{ share, want int64 }{
		{2000 * mib, 1482 * mib}, // measured largest allocation: 1472 MiB
		{3000 * mib, 2482 * mib}, // measured: 2480 MiB
		{518 * mib, 0},
		{100 * mib, 0},
	} {
		if got := Usable(tc.share); got != tc.want {
			t.Errorf("Usable(%d MiB) = %d MiB, want %d MiB", tc.share/mib, got/mib, tc.want/mib)
		}
	}
}

// TestUsableMPS: an MPS client's context grows with its percentage; the
// model stays within 10 MiB of what HAMi-core charged on a real H200, and
// never below it (a workload asked to size itself by it still fits).
func TestUsableMPS(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		share, pct int64
		// measured is the largest allocation Facet's node check saw on an
		// H200 through HAMi-core under MPS (0: no measurement).
		measured int64
	}{
		{2000 * mib, 20, 1878 * mib},
		{35788 * mib, 25, 35644 * mib},
		{4000 * mib, 50, 3726 * mib},
		{71577 * mib, 50, 71303 * mib},
		{2000 * mib, 100, 0},
		{2000 * mib, 0, 0}, // best effort: the whole GPU's SMs
		{100 * mib, 20, 0},
	} {
		got := UsableMPS(tc.share, tc.pct)
		if tc.measured != 0 && (got > tc.measured || tc.measured-got > 10*mib) {
			t.Errorf("UsableMPS(%d MiB, %d %%) = %d MiB; measured %d MiB: want at most that and within 10 MiB", tc.share/mib, tc.pct, got/mib, tc.measured/mib)
		}
		if got < 0 || got > tc.share {
			t.Errorf("UsableMPS(%d MiB, %d %%) = %d MiB, out of [0, share]", tc.share/mib, tc.pct, got/mib)
		}
	}
	if got, want := UsableMPS(2000*mib, 0), Usable(2000*mib); got != want {
		t.Errorf("best effort under MPS: %d MiB, want the whole-GPU context's %d MiB", got/mib, want/mib)
	}
	if got := UsableMPS(100*mib, 20); got != 0 {
		t.Errorf("a share smaller than its context: %d MiB usable, want 0", got/mib)
	}
}
