package sharing

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/facet-gpu/facet/pkg/model/names"
)

// fakeMPS is a Partitioner whose methods no test here calls.
type fakeMPS struct{ Partitioner }

// TestRefresh: the first refresh reports every mechanism; later ones only
// what arrived or went; a mechanism still missing keeps its newest reason
// without a change; one turned off is never opened and says so.
func TestRefresh(t *testing.T) {
	ctx := context.Background()
	up, probeErr := false, error(nil)
	opens := 0
	s := New(Options{
		OpenMPS: func(context.Context) (Partitioner, error) {
			opens++
			if !up {
				return nil, fmt.Errorf("facet-mps unreachable (try %d)", opens)
			}
			return fakeMPS{}, nil
		},
		ProbeMPS: func(context.Context, Partitioner) error { return probeErr },
		HAMiOff:  fmt.Errorf("no --hami-library: %w", ErrOff),
	})
	steps := []struct {
		name    string
		do      func()
		want    []Change
		partStr string
		why     string
	}{
		{"start: both reported", func() {}, []Change{
			{Mechanism: HAMiCore, Off: true, Why: "no --hami-library: turned off"},
			{Mechanism: MPS, Why: "facet-mps unreachable (try 1)"},
		}, names.PartitioningTimeSliced, "try 1"},
		{"still missing: no change, newest reason", func() {}, nil, names.PartitioningTimeSliced, "try 2"},
		{"arrives", func() { up = true }, []Change{{Mechanism: MPS, Available: true}}, names.PartitioningMPS, ""},
		{"still there", func() {}, nil, names.PartitioningMPS, ""},
		{"goes", func() { probeErr = errors.New("facet-mps unreachable (gone)") }, []Change{{Mechanism: MPS, Why: "facet-mps unreachable (gone)"}}, names.PartitioningTimeSliced, "gone"},
		{"back", func() { probeErr = nil }, []Change{{Mechanism: MPS, Available: true}}, names.PartitioningMPS, ""},
	}
	for _, st := range steps {
		st.do()
		got := s.Refresh(ctx)
		if fmt.Sprint(got) != fmt.Sprint(st.want) {
			t.Fatalf("%s: changes %+v, want %+v", st.name, got, st.want)
		}
		if p := s.ComputePartitioning(); p != st.partStr {
			t.Fatalf("%s: partitioning %s, want %s", st.name, p, st.partStr)
		}
		_, why := s.MPS()
		if (why == nil) != (st.why == "") || (why != nil && !errorsContains(why, st.why)) {
			t.Fatalf("%s: MPS reason %v, want one containing %q", st.name, why, st.why)
		}
	}
	if h, why := s.HAMi(); h != nil || !Off(why) {
		t.Fatalf("HAMi-core turned off: %v, %v", h, why)
	}
}

func errorsContains(err error, s string) bool {
	return err != nil && strings.Contains(err.Error(), s)
}

// TestFixed: fixed mechanisms never change, and a typed nil counts as none.
func TestFixed(t *testing.T) {
	s := Fixed(nil, errors.New("no library"), nil, fmt.Errorf("--mps=off: %w", ErrOff))
	if c := s.Refresh(context.Background()); len(c) != 0 {
		t.Fatalf("fixed mechanisms changed: %+v", c)
	}
	if p, why := s.MPS(); p != nil || !Off(why) || s.ComputePartitioning() != names.PartitioningTimeSliced {
		t.Fatalf("MPS %v, %v", p, why)
	}
	if p, _ := Fixed(nil, nil, fakeMPS{}, nil).MPS(); p == nil {
		t.Fatal("a fixed partitioner is not offered")
	}
}

// TestOpenHAMi: a claim that needs HAMi-core looks for it at once, between
// two refreshes, and the next refresh reports the arrival once.
func TestOpenHAMi(t *testing.T) {
	ctx := context.Background()
	there := false
	s := New(Options{
		OpenHAMi: func(context.Context) (ShareEditor, error) {
			if !there {
				return nil, errors.New("libvgpu.so: no such file")
			}
			return fakeHAMi{}, nil
		},
		MPSOff: fmt.Errorf("--mps=off: %w", ErrOff),
	})
	s.Refresh(ctx)
	if h, why := s.OpenHAMi(ctx); h != nil || why == nil {
		t.Fatalf("without the library: %v, %v", h, why)
	}
	there = true
	if h, why := s.OpenHAMi(ctx); h == nil || why != nil {
		t.Fatalf("library installed: %v, %v", h, why)
	}
	if c := s.Refresh(ctx); len(c) != 1 || c[0] != (Change{Mechanism: HAMiCore, Available: true}) {
		t.Fatalf("the refresh after: %+v, want HAMi-core available, once", c)
	}
	if c := s.Refresh(ctx); len(c) != 0 {
		t.Fatalf("reported again: %+v", c)
	}
}

// fakeHAMi is a ShareEditor whose methods no test here calls.
type fakeHAMi struct{ ShareEditor }
