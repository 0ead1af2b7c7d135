package scale

import (
	"time"

	"github.com/prometheus/procfs"
)

// CPUUse is where the machine's CPU went during a measurement: it tells a
// run limited by the scheduler's own work (its CPU time close to the wall
// time of the run, one or more cores busy) from one starved by the other
// processes of a shared machine (every core busy, the scheduler's share
// small).
type CPUUse struct {
	// Scheduler, APIServer and Etcd are the CPU time each process used
	// during the measurement, and Harness that of this process (its
	// clients and informers).
	Scheduler, APIServer, Etcd, Harness time.Duration
	// Busy is the CPU time of the whole machine that was not idle or in
	// I/O wait (every process, the other users' too), and Cores the
	// number of CPUs it is spread over.
	Busy  time.Duration
	Cores int
	// Load1 is the one-minute load average at the end.
	Load1 float64
	// Wall is the wall time the sample covers.
	Wall time.Duration
}

// Share is d over the wall time, in cores (1.0: one core all the time).
func (u CPUUse) Share(d time.Duration) float64 {
	if u.Wall <= 0 {
		return 0
	}
	return d.Seconds() / u.Wall.Seconds()
}

// cpuSample is the cumulative CPU seconds of the cluster's processes, this
// process and the machine at one instant.
type cpuSample struct {
	procs      map[string]float64
	self, busy float64
	cores      int
	load1      float64
	at         time.Time
}

// sampleCPU reads /proc. A process that cannot be read counts 0; the
// caller sees that as a missing value, never as an error of the run.
func (c *Cluster) sampleCPU() cpuSample {
	s := cpuSample{procs: map[string]float64{}, at: time.Now()}
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return s
	}
	for name, cmd := range c.procs {
		if p, err := fs.Proc(cmd.Process.Pid); err == nil {
			if st, err := p.Stat(); err == nil {
				s.procs[name] = st.CPUTime()
			}
		}
	}
	if p, err := fs.Self(); err == nil {
		if st, err := p.Stat(); err == nil {
			s.self = st.CPUTime()
		}
	}
	if st, err := fs.Stat(); err == nil {
		t := st.CPUTotal
		s.busy = t.User + t.Nice + t.System + t.IRQ + t.SoftIRQ + t.Steal
		s.cores = len(st.CPU)
	}
	if l, err := fs.LoadAvg(); err == nil {
		s.load1 = l.Load1
	}
	return s
}

// since is the CPU used between an earlier sample and s.
func (s cpuSample) since(before cpuSample) CPUUse {
	d := func(sec float64) time.Duration { return time.Duration(sec * float64(time.Second)) }
	return CPUUse{
		Scheduler: d(s.procs["kube-scheduler"] - before.procs["kube-scheduler"]),
		APIServer: d(s.procs["kube-apiserver"] - before.procs["kube-apiserver"]),
		Etcd:      d(s.procs["etcd"] - before.procs["etcd"]),
		Harness:   d(s.self - before.self),
		Busy:      d(s.busy - before.busy),
		Cores:     s.cores,
		Load1:     s.load1,
		Wall:      s.at.Sub(before.at),
	}
}
