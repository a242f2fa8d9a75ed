package bench

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// cpuSample is the machine's CPU ticks, all CPUs together, and one process's, at one moment.
type cpuSample struct {
	total, idle, proc uint64
}

// readCPU reads the machine's ticks from /proc/stat and the process's from /proc/PID/stat.
func readCPU(pid int) (cpuSample, error) {
	s, err := snapCPU([]Watch{{PID: pid}})
	if err != nil {
		return cpuSample{}, err
	}
	return cpuSample{total: s.total, idle: s.idle, proc: s.procs[0]}, nil
}

// cpuSnap is the machine's CPU ticks, all CPUs together, and several processes', at one moment.
type cpuSnap struct {
	total, idle uint64
	procs       []uint64 // in the order of the processes asked for
}

// snapCPU reads the machine's ticks from /proc/stat and each process's from /proc/PID/stat.
func snapCPU(procs []Watch) (cpuSnap, error) {
	var s cpuSnap
	f, err := os.Open("/proc/stat")
	if err != nil {
		return s, err
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		return s, fmt.Errorf("/proc/stat: %w", err)
	}
	if s.total, s.idle, err = parseProcStatCPU(line); err != nil {
		return s, err
	}
	for _, p := range procs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID))
		if err != nil {
			return s, fmt.Errorf("CPU of %s: %w", p.Name, err)
		}
		n, err := parsePidStatTicks(string(b))
		if err != nil {
			return s, err
		}
		s.procs = append(s.procs, n)
	}
	return s, nil
}

// since is the share of the machine's CPUs that were busy since s0, and the cores each process
// used: its ticks against the machine's over its CPUs.
func (s cpuSnap) since(s0 cpuSnap) (busy float64, cores []float64) {
	total := s.total - s0.total
	if total == 0 {
		return 0, make([]float64, len(s.procs))
	}
	busy = 1 - float64(s.idle-s0.idle)/float64(total)
	for i := range s.procs {
		cores = append(cores, float64(s.procs[i]-s0.procs[i])/float64(total)*float64(runtime.NumCPU()))
	}
	return busy, cores
}

// addCPU records what the CPUs did during one measurement on target: from s0 to s, of procs.
func (r *Result) addCPU(target string, procs []Watch, s, s0 cpuSnap) {
	if r.CPU == nil {
		r.CPU = map[string]*CPUUse{}
	}
	u := r.CPU[target]
	if u == nil {
		u = &CPUUse{Cores: map[string][]float64{}}
		r.CPU[target] = u
	}
	busy, cores := s.since(s0)
	u.Busy = append(u.Busy, busy)
	for i, p := range procs {
		u.Cores[p.Name] = append(u.Cores[p.Name], cores[i])
	}
}

// CPUTable renders, for each row and each of the targets named, the medians of what the CPUs did
// during its measurements: the cores its server used, and each of others' (processes every target
// uses, such as an iSCSI target); the share of the machine's CPUs busy; and the CPU time per I/O
// (rows in IOPS) or per MiB (rows in MiB/s) of the server and of each of others, in µs, the
// median of the per-round cores over the throughput. fio's ramp is in the CPU time but not in its
// throughput, which makes the time per I/O a little high where the ramp ran slower.
func CPUTable(w io.Writer, results []Result, names, others []string) {
	var b strings.Builder
	b.WriteString("| workload | server | server cores |")
	for _, o := range others {
		fmt.Fprintf(&b, " %s cores |", o)
	}
	b.WriteString(" machine busy | server µs per I/O or MiB |")
	for _, o := range others {
		fmt.Fprintf(&b, " %s µs per I/O or MiB |", o)
	}
	b.WriteString("\n|---|---|" + strings.Repeat("---:|", 3+2*len(others)) + "\n")
	for _, r := range results {
		for i, n := range names {
			u := r.CPU[n]
			if u == nil {
				continue
			}
			row := r.Row
			if i > 0 {
				row = ""
			}
			fmt.Fprintf(&b, "| %s | %s | %.2f |", row, n, median(u.Cores[n]))
			for _, o := range others {
				fmt.Fprintf(&b, " %.2f |", median(u.Cores[o]))
			}
			fmt.Fprintf(&b, " %.0f %% | %.1f |", 100*median(u.Busy), perUnit(u.Cores[n], r.Samples[n]))
			for _, o := range others {
				fmt.Fprintf(&b, " %.1f |", perUnit(u.Cores[o], r.Samples[n]))
			}
			b.WriteString("\n")
		}
	}
	io.WriteString(w, b.String())
}

// perUnit is the median over rounds of the CPU µs per unit of throughput: cores[i] over rate[i]
// (I/O or MiB per second).
func perUnit(cores, rate []float64) float64 {
	var per []float64
	for i := range min(len(cores), len(rate)) {
		if rate[i] > 0 {
			per = append(per, cores[i]/rate[i]*1e6)
		}
	}
	return median(per)
}

// parseProcStatCPU reads /proc/stat's first line, "cpu user nice system idle iowait irq softirq
// steal ...", into the ticks of all states and those idle or waiting for I/O.
func parseProcStatCPU(line string) (total, idle uint64, err error) {
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: first line %q is not the cpu line", line)
	}
	// guest and guest_nice (fields 9 and 10) are counted in user and nice already.
	for i, v := range f[1:min(len(f), 9)] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: cpu line %q: %w", line, err)
		}
		total += n
		if i == 3 || i == 4 {
			idle += n
		}
	}
	return total, idle, nil
}

// parsePidStatTicks reads utime+stime from /proc/PID/stat, whose second field (the command name,
// in parentheses) may hold blanks.
func parsePidStatTicks(stat string) (uint64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/PID/stat %q has no command name", stat)
	}
	// After the name: state (field 3) ... utime (14) and stime (15).
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/PID/stat %q is short", stat)
	}
	var sum uint64
	for _, v := range f[11:13] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/PID/stat %q: %w", stat, err)
		}
		sum += n
	}
	return sum, nil
}

// since says how busy the machine's CPUs were since s0 and how many of them the process used.
func (s cpuSample) since(s0 cpuSample) string {
	total := s.total - s0.total
	if total == 0 {
		return "no CPU ticks elapsed"
	}
	busy := 1 - float64(s.idle-s0.idle)/float64(total)
	cores := float64(s.proc-s0.proc) / float64(total) * float64(runtime.NumCPU())
	return fmt.Sprintf("machine CPU %.0f %% busy, tierblk %.2f of %d cores", 100*busy, cores, runtime.NumCPU())
}
