package controller

import (
	"testing"
	"time"
)

// TestBudget: a minute's worth at once, then refilled evenly; all or none.
func TestBudget(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	type step struct {
		at   time.Duration // after t0
		n    int
		wait time.Duration // what wait says before take
		took bool
	}
	for _, tc := range []struct {
		name      string
		perMinute int
		steps     []step
	}{
		{"no cap", 0, []step{{0, 1000, 0, true}, {0, 1000, 0, true}}},
		{"a burst of the whole minute, then one every 6s", 10, []step{
			{0, 10, 0, true},
			{0, 1, 6 * time.Second, false},
			{6 * time.Second, 1, 0, true},
			{6 * time.Second, 1, 6 * time.Second, false},
		}},
		{"all or none: 3 wanted, 2 there, none taken", 10, []step{
			{0, 8, 0, true},
			{0, 3, 6 * time.Second, false},
			{0, 2, 0, true},
			{0, 1, 6 * time.Second, false},
		}},
		{"the wait rounds up to a second", 7, []step{
			{0, 7, 0, true},
			{0, 1, 9 * time.Second, false}, // 60/7 = 8.57s
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBudget(tc.perMinute)
			for i, s := range tc.steps {
				now := t0.Add(s.at)
				if w := b.wait(now, s.n); w != s.wait {
					t.Errorf("step %d: wait(%d) %s, want %s", i, s.n, w, s.wait)
				}
				if took := b.take(now, s.n); took != s.took {
					t.Errorf("step %d: take(%d) %t, want %t", i, s.n, took, s.took)
				}
			}
		})
	}
	if b := newBudget(5); b.fits(6) || !b.fits(5) {
		t.Error("a cap of 5 must fit 5 at once and not 6")
	}
	if b := newBudget(0); !b.fits(1 << 20) {
		t.Error("no cap must fit anything")
	}
}
