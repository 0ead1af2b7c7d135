package controller

import (
	"errors"
	"strings"
	"testing"
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
