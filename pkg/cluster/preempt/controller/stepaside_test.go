package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestStepAside(t *testing.T) {
	gates := []string{"DRAPreemption"}
	for _, tc := range []struct {
		name   string
		mode   SchedulerMode
		server map[string]bool
		err    error
		idle   bool
		why    string
	}{
		{"1.35-1.37: the release knows no such gate", SchedulerAuto, map[string]bool{"DRAPartitionableDevices": true}, nil, false, "knows none of the gates DRAPreemption"},
		{"a release with the gate off", SchedulerAuto, map[string]bool{"DRAPreemption": false}, nil, false, "DRAPreemption is off"},
		{"a release with the gate on", SchedulerAuto, map[string]bool{"DRAPreemption": true}, nil, true, "DRAPreemption is on"},
		{"gates unreadable: preempt, and say how to stop it", SchedulerAuto, nil, errors.New("forbidden"), false, "--scheduler-preempts-claims=true to stay idle"},
		{"override: idle though the gate is off", SchedulerYes, map[string]bool{"DRAPreemption": false}, nil, true, "--scheduler-preempts-claims=true"},
		{"override: preempt though the gate is on", SchedulerNo, map[string]bool{"DRAPreemption": true}, nil, false, "--scheduler-preempts-claims=false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			idle, why := StepAside(tc.mode, gates, tc.server, tc.err)
			if idle != tc.idle || !strings.Contains(why, tc.why) {
				t.Errorf("got %t (%s), want %t with %q", idle, why, tc.idle, tc.why)
			}
		})
	}
	if _, err := ParseSchedulerMode("maybe"); err == nil {
		t.Error("ParseSchedulerMode accepted maybe")
	}
}

// TestSupervise: with auto, the gates are read again and the preemptor
// steps aside or resumes when the answer changes; a failed read changes
// nothing; with true or false nothing is read again.
func TestSupervise(t *testing.T) {
	on := map[string]bool{"DRAPreemption": true}
	off := map[string]bool{"DRAPreemption": false}
	unknown := map[string]bool{"DRAPartitionableDevices": true}
	fail := errors.New("connection refused")
	type read struct {
		gates map[string]bool
		err   error
	}
	for _, tc := range []struct {
		name   string
		mode   SchedulerMode
		reads  []read   // in turn; the last one repeats
		want   []string // act's starts and stops, and the gates it got
		reads1 bool     // read only once
	}{
		{name: "a gate turned on: it steps aside", mode: SchedulerAuto,
			reads: []read{{unknown, nil}, {off, nil}, {on, nil}},
			want:  []string{"start DRAPreemption=false", "stop"}},
		{name: "the gate turned off: it resumes, with the gates just read", mode: SchedulerAuto,
			reads: []read{{on, nil}, {on, nil}, {off, nil}},
			want:  []string{"start DRAPreemption=false"}},
		{name: "on, off, on", mode: SchedulerAuto,
			reads: []read{{on, nil}, {off, nil}, {on, nil}},
			want:  []string{"start DRAPreemption=false", "stop"}},
		{name: "a failed read keeps it preempting", mode: SchedulerAuto,
			reads: []read{{off, nil}, {nil, fail}, {nil, fail}, {off, nil}},
			want:  []string{"start DRAPreemption=false"}},
		{name: "a failed read keeps it idle", mode: SchedulerAuto,
			reads: []read{{on, nil}, {nil, fail}, {on, nil}},
			want:  nil},
		{name: "unreadable at first: it preempts, then steps aside once it reads the gate on", mode: SchedulerAuto,
			reads: []read{{nil, fail}, {on, nil}},
			want:  []string{"start error", "stop"}},
		{name: "true: idle whatever the gates, never read again", mode: SchedulerYes,
			reads: []read{{off, nil}}, reads1: true},
		{name: "false: preempting whatever the gates, never read again", mode: SchedulerNo,
			reads: []read{{on, nil}}, reads1: true,
			want: []string{"start DRAPreemption=true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			n := 0
			var got []string
			readFn := func(context.Context) (map[string]bool, error) {
				mu.Lock()
				defer mu.Unlock()
				r := tc.reads[min(n, len(tc.reads)-1)]
				n++
				return r.gates, r.err
			}
			act := func(ctx context.Context, gates map[string]bool, err error) {
				what := "start error"
				if err == nil {
					what = fmt.Sprintf("start DRAPreemption=%t", gates["DRAPreemption"])
				}
				mu.Lock()
				got = append(got, what)
				mu.Unlock()
				<-ctx.Done()
				mu.Lock()
				got = append(got, "stop")
				mu.Unlock()
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			m := NewMetrics()
			go func() {
				defer close(done)
				Supervise(ctx, tc.mode, []string{"DRAPreemption"}, readFn, time.Millisecond, m, act)
			}()
			if tc.reads1 {
				// Long enough for a hundred rereads, were there any.
				time.Sleep(100 * time.Millisecond)
			} else {
				// Every read of the list and two of the last: what
				// the last one changed is done.
				deadline := time.Now().Add(10 * time.Second)
				for {
					mu.Lock()
					reads := n
					mu.Unlock()
					if reads > len(tc.reads)+1 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("%d reads", reads)
					}
					time.Sleep(time.Millisecond)
				}
			}
			mu.Lock()
			before := append([]string(nil), got...)
			reads := n
			mu.Unlock()
			cancel()
			<-done
			if strings.Join(before, ", ") != strings.Join(tc.want, ", ") {
				t.Errorf("act: %q, want %q", before, tc.want)
			}
			if tc.reads1 && reads != 1 {
				t.Errorf("%d reads, want 1", reads)
			}
			if len(got)%2 != 0 {
				t.Errorf("act still running after Supervise returned: %q", got)
			}
		})
	}
}
