package cli

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/metrics"
	"github.com/tierblk/tierblk/internal/units"
)

type scrubOpts struct {
	actionOpts
	rate string
}

func newScrubCmd() *cobra.Command {
	o := scrubOpts{}
	cmd := &cobra.Command{
		Use:   "scrub",
		Short: "Read and check every block a running daemon's SSD tier stores",
		Long: `Asks a running daemon to scrub the SSD tier of an export's cache: read every block the tier
stores and check it against the checksum (CRC32C) it was stored with, line by line, at up to
--rate bytes a second (0, the default: as fast as the SSD goes; a line is locked only while it is
read, so a client's request waits for one line's read at most). It shows the progress, then what
it found. The daemon also scrubs on a schedule (the cache's scrub setting: every 168h at 64MiB/s by
default), and every read checks what it reads; a scrub finds damage before a read or the write-back
needs the data.

A block that fails its checksum was damaged on the SSD (bit rot, a misdirected write, a failing
device). A clean block, which the backend holds too, is dropped from the tier and read from the
backend from then on: nothing is lost. A dirty block (write-back data not yet on the backend) is
lost: its range is recorded as lost, across restarts too, and reads of it fail (EIO) rather than
return damaged bytes or the backend's older data. A lost range stays so until it is written
again: write it (restore the files it belongs to, or its data, from a backup; or, if what it held
does not matter, write zeros over it).

It exits 0 when no data is lost (damage found in clean data is reported: it was healed from the
backend), and 1 when lost ranges exist, listing them (offset and length, in bytes). Interrupting
it stops the scrub.`,
		Example: `  tierblk scrub --admin unix:/run/tierblk/admin.sock
  tierblk scrub --admin 127.0.0.1:9810 --export nas --rate 100MiB`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.bind(cmd)
			return runScrub(cmd.Context(), o)
		},
	}
	o.flags(cmd)
	cmd.Flags().StringVar(&o.rate, "rate", "0", "read at most this much a second, e.g. 100MiB (0: as fast as the SSD goes)")
	return cmd
}

func runScrub(ctx context.Context, o scrubOpts) error {
	rate, err := units.ParseRate(o.rate)
	if err != nil {
		return usageErrorf("--rate: %v", err)
	}
	final, err := doAction(ctx, o.actionOpts, "scrub", url.Values{"rate": {strconv.FormatInt(rate, 10)}}, scrubbed)
	if err != nil {
		return err
	}
	if final.Scrub == nil || final.Lost == nil {
		return fmt.Errorf("%s: scrub: the daemon's answer has no summary", exportLabel(o.export))
	}
	return writeScrubSummary(o.stdout, exportLabel(o.export), *final.Scrub, *final.Lost)
}

// scrubbed describes a scrub's progress: lines checked, bytes read, damaged blocks so far.
func scrubbed(l metrics.ActionLine, pct int64) (line, bar string) {
	var read string
	var damaged uint64
	if l.Scrub != nil {
		read, damaged = humanBytes(l.Scrub.Bytes), l.Scrub.Damaged
	}
	return fmt.Sprintf("checked %d of %d lines (%d%%), %s read, %d damaged blocks", l.Done, l.Total, pct, read, damaged),
		fmt.Sprintf("%d of %d lines, %s read, %d damaged", l.Done, l.Total, read, damaged)
}

// writeScrubSummary prints what a scrub found and the lost ranges after it; the error says the
// data of those is lost.
func writeScrubSummary(w io.Writer, label string, s cache.ScrubStats, lost cache.LostStats) error {
	fmt.Fprintf(w, "%s: scrub done: %d lines, %s read and checked in %s; ", label, s.Done, humanBytes(s.Bytes),
		took(seconds(s.Ended-s.Started)))
	if s.Damaged == 0 {
		fmt.Fprint(w, "no damaged block")
	} else {
		fmt.Fprintf(w, "%d damaged blocks", s.Damaged)
	}
	if s.Errors > 0 {
		fmt.Fprintf(w, "; %d lines could not be read (I/O errors: the daemon's log says which)", s.Errors)
	}
	fmt.Fprintln(w)
	if clean := s.Damaged - min(s.Lost, s.Damaged); clean > 0 {
		fmt.Fprintf(w, "  %d held clean data: dropped from the SSD tier, read from the backend again; nothing of them is lost\n", clean)
	}
	if s.Lost > 0 {
		fmt.Fprintf(w, "  %d held data not yet written back to the backend: lost\n", s.Lost)
	}
	if s.Damaged > 0 {
		fmt.Fprintln(w, "The SSD damaged data it stored: check its health (smartctl -a DEVICE) and consider replacing it.")
	}
	if lost.Bytes == 0 {
		return nil
	}
	writeLostRanges(w, lost)
	return fmt.Errorf("%s: %s of data is lost: the SSD tier damaged it before it was written back, and reads of the ranges listed fail (EIO) until they are written again; write them, or restore their data from a backup",
		label, humanBytes(lost.Bytes))
}

// writeLostRanges lists the lost ranges in bytes, as dd and the like take them, with the sizes in
// binary units too.
func writeLostRanges(w io.Writer, lost cache.LostStats) {
	fmt.Fprintf(w, "Lost ranges, %s in all: reads of them fail until they are written again\n", humanBytes(lost.Bytes))
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, "  offset\tlength")
	var listed uint64
	for _, r := range lost.Ranges {
		fmt.Fprintf(tw, "  %s\t%s\n", bytesAndUnits(r.Off), bytesAndUnits(r.Len))
		listed += uint64(r.Len)
	}
	tw.Flush()
	if listed < lost.Bytes {
		fmt.Fprintf(w, "  and %s more in further ranges (the daemon lists the first %d)\n", humanBytes(lost.Bytes-listed), len(lost.Ranges))
	}
}

// bytesAndUnits prints n in bytes, and in binary units too when it is 1 KiB or more.
func bytesAndUnits(n int64) string {
	if n < 1024 {
		return strconv.FormatInt(n, 10)
	}
	return fmt.Sprintf("%d (%s)", n, humanBytes(uint64(n)))
}

// took rounds the time a scrub took: to milliseconds under a second, as roughDuration above.
func took(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return roughDuration(d)
}
