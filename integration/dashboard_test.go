package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

// The dashboard (configs/grafana-dashboard.json) and the alert rules
// (configs/prometheus-alerts.yaml) are held to what a real Prometheus makes of a real daemon's
// metrics: Debian's prometheus scrapes `tierblk serve` with a write-back cache under fio load, and
// every panel query and every alert expression it is sent must find series.

const (
	dashboardFile  = "../configs/grafana-dashboard.json"
	alertsFile     = "../configs/prometheus-alerts.yaml"
	alertTestsFile = "../configs/prometheus-alerts.test.yaml"
	// dashboardExport is the export the daemon serves, which the dashboard's $export selects.
	dashboardExport = "dash"
	// rateInterval stands for Grafana's $__rate_interval: at least four scrapes of 1s.
	rateInterval = "10s"
)

// grafanaDashboard is the part of the dashboard JSON the test reads.
type grafanaDashboard struct {
	Inputs []struct {
		Name     string `json:"name"`
		PluginID string `json:"pluginId"`
	} `json:"__inputs"`
	Panels []struct {
		Title      string `json:"title"`
		Type       string `json:"type"`
		Datasource *struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

// TestAlertRulesFire runs promtool's unit tests of the alert rules
// (configs/prometheus-alerts.test.yaml): input series under which each alert fires, with its
// labels and rendered annotations, and series under which it must not. Every alert of the rules
// file must be shown firing there.
func TestAlertRulesFire(t *testing.T) {
	requireTools(t, "promtool")
	out, err := runTool(t, "promtool", "test", "rules", alertTestsFile)
	require.NoError(t, err, "promtool test rules:\n%s", out)

	var rules alertRules
	ys, err := os.ReadFile(alertsFile)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(ys, &rules))
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	ys, err = os.ReadFile(alertTestsFile)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(ys, &tests))
	fires := map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			fires[a.Alertname] = fires[a.Alertname] || len(a.ExpAlerts) > 0
		}
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			require.True(t, fires[r.Alert], "alert %s: no test in %s shows it firing", r.Alert, alertTestsFile)
		}
	}
}

// alertRules is the part of the rules file the test reads.
type alertRules struct {
	Groups []struct {
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func TestDashboardAndAlertsAgainstPrometheus(t *testing.T) {
	requireTools(t, "nbdkit", "fio", "prometheus", "promtool")
	var dash grafanaDashboard
	js, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(js, &dash))
	var rules alertRules
	ys, err := os.ReadFile(alertsFile)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(ys, &rules))
	alertsPath, err := filepath.Abs(alertsFile)
	require.NoError(t, err)

	out, err := runTool(t, "promtool", "check", "rules", alertsPath)
	require.NoError(t, err, "promtool check rules:\n%s", out)

	// The daemon: a write-back cache (RAM and SSD tiers) over a slow disk, so that fio's writes
	// make dirty data, destaging and throttling, and its reads hit both tiers and miss; replicated.
	sock := startNbdkit(t, slowDisk("48M")...)
	o := cacheOpts{backend: unixURI(sock, ""), dir: shortTempDir(t), ram: "4MiB", ssdSize: "16MiB", line: "64KiB",
		mode: "writeback", adminAddr: freeTCPAddr(t)}
	// With a replica, so that its panels and alert find series.
	_, replicaURL := startReplica(t, filepath.Join(shortTempDir(t), "dash.replica"), "64MiB")
	d := startServe(t, append(o.args(), "--export", dashboardExport, "--replica", replicaURL)...)

	// Prometheus scrapes the admin endpoint every second and evaluates the rules (which it must
	// load) as often.
	dir := t.TempDir()
	promAddr := freeTCPAddr(t)
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: tierblk
    static_configs:
      - targets: [%q]
`, alertsPath, o.adminAddr)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(config), 0o644))
	startDaemon(t, "prometheus", []string{"--config.file=" + cfgPath, "--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=" + promAddr, "--log.level=warn"}, promAddr)
	prom := promClient{t: t, base: "http://" + promAddr}

	// Load: random mixed reads and writes over 16 MiB (the SSD tier's size, so dirty data passes
	// the high watermark and is destaged), and random reads over 1 MiB, which the RAM tier holds.
	mustRunTool(t, "fio", "--ioengine=nbd", "--uri="+tcpURI(d.TCP, dashboardExport), "--time_based", "--runtime=5",
		"--iodepth=8", "--bs=4k",
		"--name=mixed", "--rw=randrw", "--size=16m",
		"--name=hot", "--rw=randread", "--offset=32m", "--size=1m")

	// At least a few scrapes of the loaded daemon, which rates over rateInterval need.
	require.Eventually(t, func() bool {
		r := prom.query(`count_over_time(up{job="tierblk"}[1m]) >= 5 and up{job="tierblk"} == 1`)
		return len(r) > 0
	}, 20*time.Second, 200*time.Millisecond, "prometheus does not scrape %s", o.adminAddr)

	t.Run("promtool check metrics", func(t *testing.T) {
		resp, err := http.Get("http://" + o.adminAddr + "/metrics")
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		cmd := exec.Command("promtool", "check", "metrics")
		cmd.Stdin = strings.NewReader(string(body))
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "promtool check metrics:\n%s", out)
	})

	t.Run("dashboard", func(t *testing.T) {
		require.Len(t, dash.Inputs, 1)
		require.Equal(t, "DS_PROMETHEUS", dash.Inputs[0].Name)
		require.Equal(t, "prometheus", dash.Inputs[0].PluginID)
		// The $export variable lists the exports from one of tierblk's series.
		require.Len(t, dash.Templating.List, 1)
		v := dash.Templating.List[0]
		require.Equal(t, "export", v.Name)
		m := regexp.MustCompile(`^label_values\((\w+), export\)$`).FindStringSubmatch(v.Definition)
		require.NotNil(t, m, "variable query %q", v.Definition)
		found := false
		for _, s := range prom.query(m[1]) {
			found = found || s.Metric["export"] == dashboardExport
		}
		require.True(t, found, "%s has no series of export %q", m[1], dashboardExport)

		queries := 0
		for _, p := range dash.Panels {
			if p.Type == "row" {
				continue
			}
			require.NotNil(t, p.Datasource, "panel %q", p.Title)
			require.Equal(t, "${DS_PROMETHEUS}", p.Datasource.UID, "panel %q", p.Title)
			require.NotEmpty(t, p.Targets, "panel %q", p.Title)
			for _, tg := range p.Targets {
				q := strings.NewReplacer("$__rate_interval", rateInterval, "$export", dashboardExport).Replace(tg.Expr)
				require.NotContains(t, q, "$", "panel %q: a variable the test does not know: %s", p.Title, tg.Expr)
				require.NotEmpty(t, prom.query(q), "panel %q: no series for %s", p.Title, q)
				queries++
			}
		}
		t.Logf("%d panel queries returned series", queries)
	})

	// An alert's condition is false on a healthy daemon, so its expression returns nothing; what
	// the test can hold it to is that it refers to series that exist, with labels that match.
	// Each alert's expression is sent twice, changed: each vector selector alone (every metric
	// and label matcher exists), and the whole expression with every comparison turned into its
	// bool form (`a > 0` becomes `a > bool 0`, 0 or 1 rather than a filter), which keeps its
	// functions, arithmetic and vector matching (on(...), and) while dropping only the thresholds.
	t.Run("alerts", func(t *testing.T) {
		n := 0
		for _, g := range rules.Groups {
			for _, r := range g.Rules {
				require.NotEmpty(t, r.Alert)
				require.NotEmpty(t, r.For, "alert %s: no for:", r.Alert)
				require.NotEmpty(t, r.Labels["severity"], "alert %s: no severity label", r.Alert)
				require.NotEmpty(t, r.Annotations["summary"], "alert %s", r.Alert)
				require.NotEmpty(t, r.Annotations["description"], "alert %s", r.Alert)
				sels := selectorRE.FindAllString(r.Expr, -1)
				require.NotEmpty(t, sels, "alert %s: no tierblk series in %s", r.Alert, r.Expr)
				for _, s := range sels {
					require.NotEmpty(t, prom.query(s), "alert %s: no series for %s", r.Alert, s)
				}
				q := boolComparisons(r.Expr)
				require.NotEmpty(t, prom.query(q), "alert %s: no series for %s", r.Alert, q)
				n++
			}
		}
		require.GreaterOrEqual(t, n, 4)
		// Prometheus loaded the rules and evaluates them.
		var resp struct {
			Groups []struct {
				Rules []struct {
					Name   string `json:"name"`
					Health string `json:"health"`
					Error  string `json:"lastError"`
				} `json:"rules"`
			} `json:"groups"`
		}
		prom.get("/api/v1/rules", nil, &resp)
		loaded := 0
		for _, g := range resp.Groups {
			for _, r := range g.Rules {
				require.NotEqual(t, "err", r.Health, "rule %s: %s", r.Name, r.Error)
				loaded++
			}
		}
		require.Equal(t, n, loaded, "rules prometheus loaded")
	})
}

// selectorRE matches a vector selector of one of tierblk's series, with its label matchers.
var selectorRE = regexp.MustCompile(`\btierblk_[a-z_]+(\{[^}]*\})?`)

// boolComparisons adds the bool modifier to every comparison operator of a PromQL expression that
// is not within a label matcher ({...}), a range ([...]) or a string.
func boolComparisons(expr string) string {
	var b strings.Builder
	depth := 0 // within {} or []
	var quote byte
	for i := 0; i < len(expr); i++ {
		c := expr[i]
		switch {
		case quote != 0:
			if c == '\\' && i+1 < len(expr) {
				b.WriteByte(c)
				i++
				c = expr[i]
			} else if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'' || c == '`':
			quote = c
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			depth--
		case depth == 0 && strings.ContainsRune("=!<>", rune(c)):
			op := string(c)
			if i+1 < len(expr) && expr[i+1] == '=' {
				op += "="
			}
			if op != "=" && op != "!" { // ==, !=, <, <=, >, >=
				b.WriteString(op + " bool")
				i += len(op) - 1
				continue
			}
		}
		b.WriteByte(c)
	}
	return b.String()
}

func TestBoolComparisons(t *testing.T) {
	for in, want := range map[string]string{
		`a{tier="ssd"} == 1`:               `a{tier="ssd"} == bool 1`,
		`a{x!="y"} != 0`:                   `a{x!="y"} != bool 0`,
		`increase(a[5m]) > 0`:              `increase(a[5m]) > bool 0`,
		`a >= on(e) (b - 0.02)`:            `a >= bool on(e) (b - 0.02)`,
		`a > 0 and on(e) (time() - a) < 5`: `a > bool 0 and on(e) (time() - a) < bool 5`,
		`a <= 1`:                           `a <= bool 1`,
	} {
		require.Equal(t, want, boolComparisons(in), in)
	}
}

// promClient queries a Prometheus server's HTTP API.
type promClient struct {
	t    *testing.T
	base string
}

// promSeries is one element of an instant vector.
type promSeries struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// query evaluates q now and returns the instant vector; a query that fails, or whose result is
// not a vector, fails the test.
func (p promClient) query(q string) []promSeries {
	p.t.Helper()
	var data struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	p.get("/api/v1/query", url.Values{"query": {q}}, &data)
	require.Equal(p.t, "vector", data.ResultType, "query %s", q)
	var v []promSeries
	require.NoError(p.t, json.Unmarshal(data.Result, &v))
	return v
}

// get GETs path with params and decodes the answer's data into data.
func (p promClient) get(path string, params url.Values, data any) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", p.base+path+"?"+params.Encode(), nil)
	require.NoError(p.t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(p.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(p.t, err)
	var r struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	require.NoError(p.t, json.Unmarshal(body, &r), "%s: %s", path, body)
	require.Equal(p.t, "success", r.Status, "%s %v: %s", path, params, r.Error)
	require.NoError(p.t, json.Unmarshal(r.Data, data))
}
