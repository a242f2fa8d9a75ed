package iscsi

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tierblk/tierblk/pkg/backend"
)

// Usage is the URL form of the scheme, for help texts and error messages.
const Usage = "iscsi://[USER[%PASSWORD]@]HOST[:PORT]/TARGET-IQN/LUN[?header_digest=crc32c][&data_digest=crc32c][&initiator-name=IQN][&reconnect-wait=DURATION]"

// DiscoveryUsage is the URL form of a portal to discover targets at.
const DiscoveryUsage = "iscsi://[USER[%PASSWORD]@]HOST[:PORT]"

// DefaultPort is the iSCSI port assigned by IANA.
const DefaultPort = 3260

// Environment variables that hold CHAP credentials. They are the preferred way to give a secret:
// a backend URL is logged, shown in errors and stored in an SSD tier's metadata (redacted where
// tierblk knows it is one, but a URL travels further than tierblk), the environment is not.
const (
	EnvUser           = "TIERBLK_ISCSI_USER"
	EnvPassword       = "TIERBLK_ISCSI_PASSWORD"
	EnvTargetUser     = "TIERBLK_ISCSI_TARGET_USER"
	EnvTargetPassword = "TIERBLK_ISCSI_TARGET_PASSWORD"
)

// maxLUN is the largest LUN the two addressing methods we encode can carry (flat space: 14 bits).
const maxLUN = 1<<14 - 1

// maxNameLen is RFC 7143's limit on an iSCSI name, in bytes.
const maxNameLen = 223

// config is what a URL and the environment say about one LUN.
type config struct {
	addr      string // HOST:PORT of the portal
	target    string // the target's iSCSI name
	lun       uint64
	initiator string // our iSCSI name; "" for defaultInitiator()
	// chap is the initiator's credentials (nil: AuthMethod=None); targetCHAP, for mutual CHAP, the
	// target's, which it must prove it knows.
	chap, targetCHAP *secret
	headerDigest     bool // ask for CRC32C header digests
	dataDigest       bool // ask for CRC32C data digests
	// reconnectWait bounds how long a command waits for a lost target to come back.
	reconnectWait time.Duration
}

// secret is one side's CHAP name and secret.
type secret struct{ user, password string }

// ParseURL parses an iscsi:// URL in libiscsi's (and so qemu's) syntax, where the user information
// is USER%PASSWORD (or USER:PASSWORD) taken literally: a '%' there separates, it does not escape, so
// the standard parser would refuse or misread it. The rest of the URL is parsed as usual. The user
// and password come back in the URL's User.
func ParseURL(raw string) (*url.URL, error) {
	rest, ok := strings.CutPrefix(raw, "iscsi://")
	if !ok {
		return nil, fmt.Errorf("iscsi URL %q: does not begin with iscsi://; use %s", backend.Redact(raw), Usage)
	}
	authority := rest
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority = rest[:i]
	}
	at := strings.LastIndex(authority, "@")
	if at < 0 {
		u, err := url.Parse(raw)
		if err != nil {
			return nil, fmt.Errorf("iscsi URL %q: %v", raw, err)
		}
		return u, nil
	}
	userinfo := authority[:at]
	u, err := url.Parse("iscsi://" + rest[at+1:])
	if err != nil {
		return nil, fmt.Errorf("iscsi URL %q: %v", backend.Redact(raw), err)
	}
	if i := strings.IndexAny(userinfo, "%:"); i >= 0 {
		u.User = url.UserPassword(userinfo[:i], userinfo[i+1:])
	} else {
		u.User = url.User(userinfo)
	}
	return u, nil
}

// parseConfig reads a parsed iscsi URL (from ParseURL) and the CHAP variables of getenv.
func parseConfig(u *url.URL, getenv func(string) string) (config, error) {
	var c config
	var err error
	bad := func(format string, args ...any) (config, error) {
		return config{}, fmt.Errorf("iscsi URL %q: %s; use %s", u.Redacted(), fmt.Sprintf(format, args...), Usage)
	}
	if c.addr, err = portal(u); err != nil {
		return bad("%v", err)
	}

	parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	if len(parts) != 2 || parts[0] == "" {
		return bad("the path %q is not /TARGET-IQN/LUN", u.Path)
	}
	if err := checkName(parts[0]); err != nil {
		return bad("target name %q: %v", parts[0], err)
	}
	c.target = parts[0]
	lun, err := strconv.ParseUint(parts[1], 10, 64)
	if err != nil || lun > maxLUN {
		return bad("LUN %q is not a number from 0 to %d", parts[1], maxLUN)
	}
	c.lun = lun

	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return bad("query: %v", err)
	}
	for k, v := range q {
		if len(v) != 1 {
			return bad("%s= is given %d times", k, len(v))
		}
	}
	for _, d := range []struct {
		key string
		on  *bool
	}{{"header_digest", &c.headerDigest}, {"data_digest", &c.dataDigest}} {
		if v, ok := q[d.key]; ok {
			switch strings.ToLower(v[0]) {
			case "crc32c":
				*d.on = true
			case "none":
			default:
				return bad("%s=%s is neither crc32c nor none", d.key, v[0])
			}
			delete(q, d.key)
		}
	}
	c.reconnectWait = DefaultReconnectWait
	if v, ok := q["reconnect-wait"]; ok {
		d, err := time.ParseDuration(v[0])
		if err != nil || d <= 0 {
			return bad("reconnect-wait=%s is not a duration above zero, such as 30s or 5m", v[0])
		}
		c.reconnectWait = d
		delete(q, "reconnect-wait")
	}
	if v, ok := q["initiator-name"]; ok {
		if err := checkName(v[0]); err != nil {
			return bad("initiator-name %q: %v", v[0], err)
		}
		c.initiator = v[0]
		delete(q, "initiator-name")
	}
	for _, k := range []string{"target_user", "target_password"} {
		if _, ok := q[k]; ok {
			return bad("%s= would put the target's CHAP secret in the URL; set %s and %s instead", k, EnvTargetUser, EnvTargetPassword)
		}
	}
	if len(q) > 0 {
		var unknown []string
		for k := range q {
			unknown = append(unknown, k)
		}
		sort.Strings(unknown)
		return bad("unknown query parameter %s", strings.Join(unknown, ", "))
	}

	if c.chap, c.targetCHAP, err = chapConfig(u, getenv); err != nil {
		return bad("%v", err)
	}
	return c, nil
}

// parseDiscoveryConfig reads a discovery URL, iscsi://[USER[%PASSWORD]@]HOST[:PORT] (from
// ParseURL), and the CHAP variables of getenv: a portal and credentials, no target.
func parseDiscoveryConfig(u *url.URL, getenv func(string) string) (config, error) {
	var c config
	var err error
	bad := func(format string, args ...any) (config, error) {
		return config{}, fmt.Errorf("iscsi URL %q: %s; use %s", u.Redacted(), fmt.Sprintf(format, args...), DiscoveryUsage)
	}
	if c.addr, err = portal(u); err != nil {
		return bad("%v", err)
	}
	if strings.Trim(u.Path, "/") != "" || u.RawQuery != "" {
		return bad("discovery takes a portal only, not a target or options")
	}
	if c.chap, c.targetCHAP, err = chapConfig(u, getenv); err != nil {
		return bad("%v", err)
	}
	return c, nil
}

// portal returns the HOST:PORT of an iscsi URL.
func portal(u *url.URL) (string, error) {
	if u.Scheme != "iscsi" {
		return "", fmt.Errorf("scheme %q is not iscsi", u.Scheme)
	}
	if u.Opaque != "" || u.Host == "" {
		return "", errors.New("no host: write iscsi://HOST/")
	}
	port := u.Port()
	if port == "" {
		port = strconv.Itoa(DefaultPort)
	} else if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return "", fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}

// chapConfig returns the initiator's CHAP credentials (from the URL or the environment) and, for
// mutual CHAP, the target's (from the environment only); nil for none.
func chapConfig(u *url.URL, getenv func(string) string) (chap, targetCHAP *secret, err error) {
	if chap, err = credentials(u, getenv); err != nil {
		return nil, nil, err
	}
	tu, tp := getenv(EnvTargetUser), getenv(EnvTargetPassword)
	switch {
	case tu == "" && tp == "":
		return chap, nil, nil
	case tu == "" || tp == "":
		return nil, nil, fmt.Errorf("mutual CHAP needs both %s and %s", EnvTargetUser, EnvTargetPassword)
	case chap == nil:
		return nil, nil, fmt.Errorf("mutual CHAP (%s) needs the initiator's CHAP credentials too (a user in the URL or %s, and %s)", EnvTargetUser, EnvUser, EnvPassword)
	}
	return chap, &secret{tu, tp}, nil
}

// credentials returns the initiator's CHAP name and secret: the URL's, else the environment's; nil
// for none. A name without a secret or a secret without a name is an error.
func credentials(u *url.URL, getenv func(string) string) (*secret, error) {
	user, password := getenv(EnvUser), getenv(EnvPassword)
	if u.User != nil {
		user = u.User.Username()
		if p, ok := u.User.Password(); ok {
			password = p
		}
	}
	switch {
	case user == "" && password == "":
		return nil, nil
	case user == "":
		return nil, fmt.Errorf("a CHAP password without a user name; put USER@ in the URL or set %s", EnvUser)
	case password == "":
		return nil, fmt.Errorf("CHAP user %q has no password; set %s (or write USER%%PASSWORD@ in the URL)", user, EnvPassword)
	}
	return &secret{user, password}, nil
}

// checkName checks the form of an iSCSI name (RFC 7143 section 4.2.7): iqn., eui. or naa. and
// printable characters without spaces.
func checkName(n string) error {
	lower := strings.ToLower(n)
	if !strings.HasPrefix(lower, "iqn.") && !strings.HasPrefix(lower, "eui.") && !strings.HasPrefix(lower, "naa.") {
		return errors.New(`an iSCSI name begins with "iqn.", "eui." or "naa."`)
	}
	if len(n) > maxNameLen {
		return fmt.Errorf("longer than %d bytes", maxNameLen)
	}
	for _, r := range n {
		if r <= ' ' || r == 0x7f || r == '/' {
			return fmt.Errorf("holds the character %q", r)
		}
	}
	return nil
}

// defaultInitiator is our iSCSI name when the URL gives none: one per machine, so that a target's
// ACLs and logs can tell initiators apart.
func defaultInitiator() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	var b strings.Builder
	for _, r := range strings.ToLower(host) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '-' {
			b.WriteRune(r)
		}
	}
	return "iqn.2026-01.io.github.tierblk:" + b.String()
}
