package bench

import (
	"bufio"
	"fmt"
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
	var s cpuSample
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
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	s.proc, err = parsePidStatTicks(string(b))
	return s, err
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
