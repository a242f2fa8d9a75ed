package sim

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
)

// CSVHeader is the exact header of --output csv; scripts depend on it.
var CSVHeader = []string{"policy", "cache_size", "requests", "miss_ratio", "byte_miss_ratio", "throughput_mqps", "fetch_ratio"}

// WriteCSV writes one row per result. Estimated results (Options.Sample) get one more column,
// "estimate", which says how; an exact replay's header stays CSVHeader.
func WriteCSV(w io.Writer, rs []Result) error {
	cw := csv.NewWriter(w)
	estimated := len(rs) > 0 && rs[0].Estimate != ""
	header := CSVHeader
	if estimated {
		header = append(header[:len(header):len(header)], "estimate")
	}
	cw.Write(header)
	for _, r := range rs {
		row := []string{
			policyLabel(r), strconv.Itoa(r.CacheSize), strconv.FormatInt(r.Requests, 10),
			strconv.FormatFloat(r.MissRatio, 'f', 6, 64), strconv.FormatFloat(r.ByteMissRatio, 'f', 6, 64),
			strconv.FormatFloat(r.ThroughputMQPS, 'f', 3, 64), strconv.FormatFloat(r.FetchRatio, 'f', 4, 64),
		}
		if estimated {
			row = append(row, r.Estimate)
		}
		cw.Write(row)
	}
	cw.Flush()
	return cw.Error()
}

// WriteJSON writes the results as a JSON array.
func WriteJSON(w io.Writer, rs []Result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rs)
}

// WriteTable writes a table for people; keys names what a cache's size counts (lines, blocks,
// objects), the heading of that column.
func WriteTable(w io.Writer, rs []Result, keys string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "policy\tsize\t%s\trequests\tmiss ratio\tbyte miss ratio\tfetched/read\tMreq/s\t\n", keys)
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.4f\t%.4f\t%.2f\t%.2f\t\n", policyLabel(r), r.SizeLabel, r.CacheSize, r.Requests,
			r.MissRatio, r.ByteMissRatio, r.FetchRatio, r.ThroughputMQPS)
	}
	return tw.Flush()
}

// policyLabel names the eviction policy, with its admission policy unless that admits every miss.
func policyLabel(r Result) string {
	if r.Admission == "" || r.Admission == "always" {
		return r.Policy
	}
	return r.Policy + "+" + r.Admission
}
