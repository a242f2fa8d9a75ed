package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/tierblk/tierblk/internal/cache"
)

// The checksum benchmark: what checking every SSD-tier block's CRC32C costs the hit
// path and write-back writes, against a baseline tierblk built without the checks (there is no
// switch to turn them off), and against qemu-nbd as the hit part measures it. The builds run the
// same command lines, each with its own files, in the same rounds.
const (
	// ChecksumSSD is every tierblk's SSD tier, larger than the default working set (128 MiB).
	ChecksumSSD = HitsSSD
	// The builds, as the target names start.
	checksumThis     = "this"
	checksumBaseline = "baseline"
)

// ChecksumReductions are the SSD tier's reductions the checksum part runs each build with: the
// default first.
func ChecksumReductions() []string { return []string{"compress", "off"} }

// checksumName is a tierblk target's name: its build and its reduction, e.g. "this compress".
func checksumName(build, reduction string) string { return build + " " + reduction }

// ChecksumHitRows are the checksum part's hit rows: the hit part's (HitRows), every read an
// SSD-tier hit.
func ChecksumHitRows() []Row { return HitRows() }

// ChecksumWriteRow is the checksum part's write row: 4K random writes of data in write-back, over
// tierblks flushed before each measurement.
func ChecksumWriteRow() Row { return ReductionWriteRow() }

// checksumTargets are the servers of one group of the checksum part, in the table's order: for
// each reduction, this build (bin) and the baseline, then qemu-nbd over a file of its own in dir
// (made by the caller). Each tierblk serves a backend file of its own in dir with --ram 0 and an
// SSD tier of ChecksumSSD, with an admin endpoint (checksumAdmin); mode writeback adds --mode
// writeback, "" leaves the default (write-through). Nothing else differs from tierblk's defaults.
func checksumTargets(bin, baseline, dir, group, mode string) []Target {
	var out []Target
	for _, r := range ChecksumReductions() {
		for _, b := range []struct{ build, path string }{{checksumThis, bin}, {checksumBaseline, baseline}} {
			name := checksumName(b.build, r)
			key := checksumKey(group, name)
			out = append(out, Target{Name: name, Command: func(sock string) *exec.Cmd {
				args := []string{"serve", "--backend", "file://" + filepath.Join(dir, key+"-backend.img") + "?size=1GiB",
					"--nbd", "unix:" + sock, "--ram", "0", "--ssd", filepath.Join(dir, key+"-ssd.img"), "--ssd-size", ChecksumSSD,
					"--reduction", r}
				if mode != "" {
					args = append(args, "--mode", mode)
				}
				args = append(args, "--admin", "unix:"+checksumAdmin(dir, group, name), "--log-level", "warn")
				return exec.Command(b.path, args...)
			}})
		}
	}
	return append(out, Target{Name: nameQemuNBD, Command: func(sock string) *exec.Cmd {
		return exec.Command("qemu-nbd", "-t", "-f", "raw", "--cache=none", "--aio=native", "-k", sock, checksumQemuImage(dir, group))
	}})
}

// checksumKey names a tierblk's files in its group's directory: "h-this-compress".
func checksumKey(group, name string) string { return group + "-" + strings.ReplaceAll(name, " ", "-") }

func checksumAdmin(dir, group, name string) string {
	return filepath.Join(dir, checksumKey(group, name)+"-admin.sock")
}

func checksumQemuImage(dir, group string) string { return filepath.Join(dir, group+"-qemu-nbd.img") }

// ChecksumReport is what RunChecksums measured.
type ChecksumReport struct {
	// Version and BaselineVersion are what `tierblk version` printed for each build.
	Version, BaselineVersion string
	// Results are ChecksumHitRows, then ChecksumWriteRow, with each target's CPU.
	Results []Result
	// HitLookups are each tierblk's SSD-tier lookups during the hit rows: a miss means a read that
	// was not a hit.
	HitLookups map[string]Lookups
}

// Lookups are an SSD tier's line lookups over a span of time.
type Lookups struct{ Hits, Misses uint64 }

// lookupsBetween are the lookups from the counters before to those after.
func lookupsBetween(before, after cache.TierStats) Lookups {
	return Lookups{Hits: after.Hits - before.Hits, Misses: after.Misses - before.Misses}
}

// RunChecksums measures this build (o.Tierblk) against the baseline tierblk binary and qemu-nbd,
// alternating which goes first from round to round. First the hit rows (ChecksumHitRows), on
// tierblks in write-through with --ram 0 whose SSD tiers hold the working set (o.Size), written
// and read once first; then ChecksumWriteRow on tierblks in write-back over the working set written
// once, each flushed (`tierblk flush` of its own build, not timed) after that and after each of its
// measurements, so that every measurement starts with no dirty data and no tierblk writes back
// while another is measured. qemu-nbd serves a file of the working set in each group. The CPU of
// every server is recorded during its measurements. o.SlowRuntime is not used.
func RunChecksums(ctx context.Context, o CacheOptions, baseline string) (ChecksumReport, error) {
	if err := o.check(); err != nil {
		return ChecksumReport{}, err
	}
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		return ChecksumReport{}, fmt.Errorf("qemu-nbd is not installed; run `make deps` (Debian package qemu-utils)")
	}
	if baseline == "" {
		return ChecksumReport{}, errors.New("no baseline: give a tierblk binary of the build to compare with")
	}
	var rep ChecksumReport
	var err error
	if rep.Version, err = tierblkVersion(ctx, o.Tierblk); err != nil {
		return ChecksumReport{}, err
	}
	if rep.BaselineVersion, err = tierblkVersion(ctx, baseline); err != nil {
		return ChecksumReport{}, fmt.Errorf("baseline: %w", err)
	}
	dir, err := os.MkdirTemp(o.WorkDir, "checksums")
	if err != nil {
		return ChecksumReport{}, err
	}
	defer os.RemoveAll(dir)
	if dir, err = filepath.Abs(dir); err != nil { // file:// URLs take absolute paths
		return ChecksumReport{}, err
	}
	rep.HitLookups = map[string]Lookups{}
	for _, g := range []struct {
		group, mode string
		rows        []Row
	}{{"h", "", ChecksumHitRows()}, {"w", "writeback", []Row{ChecksumWriteRow()}}} {
		res, err := runChecksumGroup(ctx, o, baseline, dir, g.group, g.mode, g.rows, &rep)
		if err != nil {
			return ChecksumReport{}, err
		}
		rep.Results = append(rep.Results, res...)
	}
	return rep, nil
}

// runChecksumGroup starts checksumTargets(group, mode), prefills them, measures rows on them and
// stops them; the hit group (mode "") records its SSD-tier lookups in rep.
func runChecksumGroup(ctx context.Context, o CacheOptions, baseline, dir, group, mode string, rows []Row, rep *ChecksumReport) ([]Result, error) {
	if err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "raw", checksumQemuImage(dir, group), "1G").Run(); err != nil {
		return nil, fmt.Errorf("qemu-img create: %w", err)
	}
	var servers []*server
	defer func() {
		for _, s := range servers {
			s.close()
		}
	}()
	bins := map[string]string{}
	for _, r := range ChecksumReductions() {
		bins[checksumName(checksumThis, r)] = o.Tierblk
		bins[checksumName(checksumBaseline, r)] = baseline
	}
	var probes []probe
	before := map[string]cache.TierStats{}
	for i, t := range checksumTargets(o.Tierblk, baseline, dir, group, mode) {
		// The server's process, for its CPU.
		var proc *exec.Cmd
		command := t.Command
		t.Command = func(sock string) *exec.Cmd {
			proc = command(sock)
			return proc
		}
		s := &server{Target: t, sock: filepath.Join(dir, fmt.Sprintf("%s%d.sock", group, i))}
		if err := s.start(ctx); err != nil {
			return nil, err
		}
		servers = append(servers, s)
		p := probe{name: t.Name, ep: s.endpoint(), runtime: o.Runtime, ramp: time.Second, cpu: []Watch{{Name: t.Name, PID: proc.Process.Pid}}}
		passes := []struct{ what, rw string }{{"prefilling", "--rw=write"}}
		if mode == "" {
			// Written, then read once: every block of the working set is in the SSD tier.
			passes = append(passes, struct{ what, rw string }{"warming up", "--rw=read"})
		}
		for _, pass := range passes {
			if err := o.pass(ctx, s, pass.what, pass.rw); err != nil {
				return nil, err
			}
		}
		bin, isTierblk := bins[t.Name]
		switch {
		case isTierblk && mode == "writeback":
			admin, name := checksumAdmin(dir, group, t.Name), t.Name
			p.after = func() error { return flushTierblk(ctx, bin, name, admin, o.Log) }
			if err := p.after(); err != nil {
				return nil, err
			}
		case isTierblk:
			st, err := ssdStats(ctx, checksumAdmin(dir, group, t.Name))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", t.Name, err)
			}
			before[t.Name] = st
		}
		probes = append(probes, p)
	}
	var results []Result
	for _, row := range rows {
		r, err := measure(ctx, row, probes, o.Rounds, o.Size, o.Log, nil)
		if err != nil {
			return nil, err
		}
		results = append(results, r)
	}
	for name, st0 := range before {
		st, err := ssdStats(ctx, checksumAdmin(dir, group, name))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		rep.HitLookups[name] = lookupsBetween(st0, st)
	}
	return results, nil
}

// ssdStats are the counters of the SSD tier, the only tier, of the tierblk at the admin socket.
func ssdStats(ctx context.Context, admin string) (cache.TierStats, error) {
	client := adminClient(admin)
	defer client.CloseIdleConnections()
	st, err := getStats(ctx, client)
	if err != nil {
		return cache.TierStats{}, err
	}
	if len(st.Tiers) != 1 || st.Tiers[0].Name != "ssd" {
		return cache.TierStats{}, fmt.Errorf("%d cache tiers, want the SSD tier alone", len(st.Tiers))
	}
	return st.Tiers[0], nil
}

// tierblkVersion is the line `bin version` prints, which also proves bin a tierblk.
func tierblkVersion(ctx context.Context, bin string) (string, error) {
	out, err := exec.CommandContext(ctx, bin, "version").Output()
	v := strings.TrimSpace(string(out))
	if err != nil || !strings.HasPrefix(v, "tierblk ") {
		return "", fmt.Errorf("%s is not a tierblk binary: `%s version` printed %q (%v)", bin, bin, v, err)
	}
	return v, nil
}

// checksumColumns are the table's targets and its ratios: for each reduction, this build over the
// baseline and over qemu-nbd.
func checksumColumns() (names []string, pairs [][2]string) {
	for _, r := range ChecksumReductions() {
		this, base := checksumName(checksumThis, r), checksumName(checksumBaseline, r)
		names = append(names, this, base)
		pairs = append(pairs, [2]string{this, base}, [2]string{this, nameQemuNBD})
	}
	return append(names, nameQemuNBD), pairs
}

// ChecksumTable renders the report: the builds' versions, each target's median and the medians of
// the per-round ratios this/baseline and this/qemu-nbd with their lowest and highest; the SSD-tier
// lookups of the hit rows; and the CPU each server used.
func ChecksumTable(w io.Writer, rep ChecksumReport) {
	fmt.Fprintf(w, "this: %s; baseline: %s\n\n", rep.Version, rep.BaselineVersion)
	names, pairs := checksumColumns()
	pairedTable(w, rep.Results, names, pairs)
	var lookups []string
	for _, n := range names {
		if l, ok := rep.HitLookups[n]; ok {
			lookups = append(lookups, fmt.Sprintf("%s %d hits, %d misses", n, l.Hits, l.Misses))
		}
	}
	fmt.Fprintf(w, "\nSSD-tier line lookups during the hit rows (a miss is a read that was not a hit): %s.\n", strings.Join(lookups, "; "))
	fmt.Fprintf(w, "\nCPU during each server's runs (fio's ramp included), medians; µs per I/O (IOPS rows) or per MiB (MiB/s rows):\n\n")
	CPUTable(w, rep.Results, names, nil)
}
