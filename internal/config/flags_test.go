package config

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

// sample is a value of kind k that Override stores.
func sample(k Kind) string {
	return map[Kind]string{String: "some-text", Int: "7", Ratio64: "0.125", List: "unix:/x.sock", Bool: "true"}[k]
}

// yamlAt returns what the YAML form of c holds at path ("exports[0].cache.ram", "listen[0]").
func yamlAt(t *testing.T, c Config, path string) any {
	t.Helper()
	data, err := yaml.Marshal(c)
	require.NoError(t, err)
	var v any
	require.NoError(t, yaml.Unmarshal(data, &v))
	for _, part := range strings.Split(path, ".") {
		name, index, indexed := strings.Cut(strings.TrimSuffix(part, "]"), "[")
		m, ok := v.(map[string]any)
		require.True(t, ok, "%s: %q is not a mapping", path, name)
		v = m[name]
		if indexed {
			i, err := strconv.Atoi(index)
			require.NoError(t, err)
			l, ok := v.([]any)
			require.True(t, ok && i < len(l), "%s: no %s", path, part)
			v = l[i]
		}
	}
	return v
}

// Each flag stores what it is given in the very field its errors name: the one declaration holds
// for the field, the flag and the error alike.
func TestFlagsSetTheirField(t *testing.T) {
	for _, f := range Flags {
		if f.Field == "" {
			continue
		}
		t.Run(f.Name, func(t *testing.T) {
			given := map[string][]string{"backend": {"mem://1MiB"}, f.Name: {sample(f.Kind)}}
			if strings.HasPrefix(f.Name, "ublk-") {
				given["ublk"] = []string{"true"}
			}
			c := Defaults()
			require.NoError(t, Override(&c, given, false))
			got := yamlAt(t, c, strings.ReplaceAll(f.Field, "[]", "[0]"))
			require.Equal(t, sample(f.Kind), toText(got))
		})
	}
}

func toText(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case int:
		return strconv.Itoa(x)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case bool:
		return strconv.FormatBool(x)
	}
	return "<not a scalar>"
}

// An error about a field a flag set names the flag; other words stay as they are.
func TestFlagNames(t *testing.T) {
	for _, f := range Flags {
		if f.Field == "" {
			continue
		}
		field := strings.ReplaceAll(f.Field, "[]", "[3]")
		require.Equal(t, "--"+f.Name+": is wrong", FlagNames(field+": is wrong"), f.Name)
	}
	for msg, want := range map[string]string{
		"exports[0].cache.ssd_size: too small":                "--ssd-size: too small",
		"exports[0].cache.ssd: gone\nexports[0].cache.ram: 0": "--ssd: gone\n--ram: 0",
		"exports[1].cache.ram: too small":                     "exports[1].cache.ram: too small", // another export's, from a file
		"log_level: use an admin endpoint":                    "--log-level: use an admin endpoint",
		`exports[0] ("x"): open: no such file`:                "--backend: open: no such file",
		`exports[0] (""): record_trace: open /nope/x: gone`:   "--record-trace: open /nope/x: gone",
		`exports[0] ("x"): nbd_device: busy`:                  "--nbd-device: busy",
		"exports[0].cache: ssd: in use":                       "ssd: in use",
		"allow: is set but no listen address is HOST:PORT":    "--allow: is set but no listen address is HOST:PORT",
	} {
		require.Equal(t, want, FlagNames(msg))
	}
}

// A flag's text that is not of its kind is refused.
func TestKindCheck(t *testing.T) {
	for _, c := range []struct {
		k  Kind
		ok []string
		no []string
	}{
		{String, []string{"", "x"}, nil},
		{List, []string{"unix:/a"}, nil},
		{Bool, []string{"true", "false", "1"}, []string{"perhaps"}},
		{Int, []string{"-1", "64"}, []string{"1.5", "many"}},
		{Ratio64, []string{"0", "0.25", "1"}, []string{"half"}},
	} {
		for _, s := range c.ok {
			require.NoError(t, c.k.Check(s), "%s %q", c.k.Type(), s)
		}
		for _, s := range c.no {
			require.Error(t, c.k.Check(s), "%s %q", c.k.Type(), s)
		}
	}
}

// The configuration reference documents every flag, and says its default where it has one.
func TestFlagsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	require.NoError(t, err)
	for _, f := range Flags {
		row := regexp.MustCompile("(?m)^\\| [^\\n]*`--" + regexp.QuoteMeta(f.Name) + "[ `][^\\n]*$").Find(doc)
		require.NotNil(t, row, "docs/configuration.md has no row for --%s", f.Name)
		if f.Def != "" {
			require.Contains(t, string(row), f.Def, "docs/configuration.md: the default of --%s", f.Name)
		}
	}
}

// A daemon not run by root gets a run directory it may write, on a tmpfs: /run/tierblk where it
// is that user's (a container image's), else its session's runtime directory, else its own under
// /dev/shm; root keeps /run/tierblk.
func TestDefaultRunDir(t *testing.T) {
	for _, tc := range []struct {
		euid  int
		xdg   string
		owner int // of /run/tierblk; -1: there is none
		want  string
	}{
		{0, "/run/user/0", -1, "/run/tierblk"},
		{1000, "/run/user/1000", 0, "/run/user/1000/tierblk"},
		{1000, "", -1, "/dev/shm/tierblk-1000"},
		{1000, "relative", 0, "/dev/shm/tierblk-1000"},
		{65532, "", 65532, "/run/tierblk"},
	} {
		got := defaultRunDir(tc.euid, func(k string) string {
			if k == "XDG_RUNTIME_DIR" {
				return tc.xdg
			}
			return ""
		}, func(string) (int, bool) { return tc.owner, tc.owner >= 0 })
		require.Equal(t, tc.want, got, "euid %d, XDG_RUNTIME_DIR %q, /run/tierblk's owner %d", tc.euid, tc.xdg, tc.owner)
	}
}
