package iscsi

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseConfig(t *testing.T) {
	const iqn = "iqn.2001-04.com.example:storage.disk1"
	for _, tc := range []struct {
		url  string
		env  map[string]string
		want config
		err  string // part of the error; "" for a good URL
	}{
		{url: "iscsi://nas/" + iqn + "/1", want: config{addr: "nas:3260", target: iqn, lun: 1}},
		{url: "iscsi://10.0.0.5:3261/" + iqn + "/0", want: config{addr: "10.0.0.5:3261", target: iqn}},
		{url: "iscsi://[fe80::1]/" + iqn + "/16383", want: config{addr: "[fe80::1]:3260", target: iqn, lun: 16383}},
		{url: "iscsi://nas/eui.02004567A425678D/2", want: config{addr: "nas:3260", target: "eui.02004567A425678D", lun: 2}},
		{url: "iscsi://nas/iqn.2001-04.com.example%3Adisk/1", want: config{addr: "nas:3260", target: "iqn.2001-04.com.example:disk", lun: 1}},
		{url: "iscsi://alice%s3cr%t@nas/" + iqn + "/1",
			want: config{addr: "nas:3260", target: iqn, lun: 1, chap: &secret{"alice", "s3cr%t"}}},
		{url: "iscsi://alice:pa:ss@nas/" + iqn + "/1",
			want: config{addr: "nas:3260", target: iqn, lun: 1, chap: &secret{"alice", "pa:ss"}}},
		{url: "iscsi://alice%p@ss@nas/" + iqn + "/1",
			want: config{addr: "nas:3260", target: iqn, lun: 1, chap: &secret{"alice", "p@ss"}}},
		{url: "iscsi://nas/" + iqn + "/1", env: map[string]string{EnvUser: "bob", EnvPassword: "envsecret"},
			want: config{addr: "nas:3260", target: iqn, lun: 1, chap: &secret{"bob", "envsecret"}}},
		{url: "iscsi://alice@nas/" + iqn + "/1", env: map[string]string{EnvUser: "bob", EnvPassword: "envsecret"},
			want: config{addr: "nas:3260", target: iqn, lun: 1, chap: &secret{"alice", "envsecret"}}},
		{url: "iscsi://alice%urlsecret@nas/" + iqn + "/1", env: map[string]string{EnvPassword: "envsecret"},
			want: config{addr: "nas:3260", target: iqn, lun: 1, chap: &secret{"alice", "urlsecret"}}},
		{url: "iscsi://alice%a@nas/" + iqn + "/1", env: map[string]string{EnvTargetUser: "tgt", EnvTargetPassword: "tsecret"},
			want: config{addr: "nas:3260", target: iqn, lun: 1, chap: &secret{"alice", "a"}, targetCHAP: &secret{"tgt", "tsecret"}}},
		{url: "iscsi://nas/" + iqn + "/1?header_digest=crc32c&data_digest=CRC32C&initiator-name=iqn.2026-01.org.example:me",
			want: config{addr: "nas:3260", target: iqn, lun: 1, headerDigest: true, dataDigest: true, initiator: "iqn.2026-01.org.example:me"}},
		{url: "iscsi://nas/" + iqn + "/1?header_digest=none", want: config{addr: "nas:3260", target: iqn, lun: 1}},
		{url: "iscsi://nas/" + iqn + "/1?reconnect-wait=10m", want: config{addr: "nas:3260", target: iqn, lun: 1, reconnectWait: 10 * time.Minute}},

		{url: "nbd://nas/x", err: "does not begin with iscsi://"},
		{url: "iscsi:nas/" + iqn + "/1", err: "does not begin with iscsi://"},
		{url: "iscsi:///" + iqn + "/1", err: "no host"},
		{url: "iscsi://nas:0/" + iqn + "/1", err: `port "0" is not a number from 1 to 65535`},
		{url: "iscsi://nas:99999/" + iqn + "/1", err: `port "99999"`},
		{url: "iscsi://nas", err: `the path "" is not /TARGET-IQN/LUN`},
		{url: "iscsi://nas/" + iqn, err: "is not /TARGET-IQN/LUN"},
		{url: "iscsi://nas/" + iqn + "/1/2", err: "is not /TARGET-IQN/LUN"},
		{url: "iscsi://nas//1", err: "is not /TARGET-IQN/LUN"},
		{url: "iscsi://nas/disk1/1", err: `target name "disk1": an iSCSI name begins with "iqn.", "eui." or "naa."`},
		{url: "iscsi://nas/iqn.x%20y/1", err: `holds the character ' '`},
		{url: "iscsi://nas/" + iqn + "/x", err: `LUN "x" is not a number from 0 to 16383`},
		{url: "iscsi://nas/" + iqn + "/16384", err: `LUN "16384"`},
		{url: "iscsi://nas/" + iqn + "/-1", err: `LUN "-1"`},
		{url: "iscsi://nas/" + iqn + "/1?data_digest=md5", err: "data_digest=md5 is neither crc32c nor none"},
		{url: "iscsi://nas/" + iqn + "/1?header_digest=crc32c&header_digest=none", err: "header_digest= is given 2 times"},
		{url: "iscsi://nas/" + iqn + "/1?initiator-name=me", err: `initiator-name "me"`},
		{url: "iscsi://nas/" + iqn + "/1?reconnect-wait=0s", err: "reconnect-wait=0s is not a duration above zero"},
		{url: "iscsi://nas/" + iqn + "/1?reconnect-wait=soon", err: "reconnect-wait=soon is not a duration"},
		{url: "iscsi://nas/" + iqn + "/1?target_password=x", err: "target_password= would put the target's CHAP secret in the URL; set TIERBLK_ISCSI_TARGET_USER"},
		{url: "iscsi://nas/" + iqn + "/1?zz=1&aa=2", err: "unknown query parameter aa, zz"},
		{url: "iscsi://nas/" + iqn + "/1?a=%zz", err: "query"},
		{url: "iscsi://alice@nas/" + iqn + "/1", err: `CHAP user "alice" has no password; set TIERBLK_ISCSI_PASSWORD`},
		{url: "iscsi://nas/" + iqn + "/1", env: map[string]string{EnvPassword: "x"}, err: "a CHAP password without a user name"},
		{url: "iscsi://nas/" + iqn + "/1", env: map[string]string{EnvTargetUser: "t", EnvTargetPassword: "x"},
			err: "mutual CHAP (TIERBLK_ISCSI_TARGET_USER) needs the initiator's CHAP credentials too"},
		{url: "iscsi://a%b@nas/" + iqn + "/1", env: map[string]string{EnvTargetUser: "t"}, err: "mutual CHAP needs both"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			u, err := ParseURL(tc.url)
			if err == nil {
				var c config
				c, err = parseConfig(u, func(k string) string { return tc.env[k] })
				if tc.err == "" {
					require.NoError(t, err)
					if tc.want.reconnectWait == 0 {
						tc.want.reconnectWait = DefaultReconnectWait
					}
					require.Equal(t, tc.want, c)
					return
				}
			}
			require.ErrorContains(t, err, tc.err)
		})
	}
}

// Errors about a URL never show its password.
func TestParseConfigHidesPassword(t *testing.T) {
	for _, raw := range []string{
		"iscsi://alice%topsecret@nas/disk/1",
		"iscsi://alice:topsecret@nas/iqn.x:y/1?bad=1",
		"iscsi://alice%topsecret@nas:0/iqn.x:y/1",
		"iscsi://alice%topsecret@nas:port/iqn.x:y/1",
	} {
		u, err := ParseURL(raw)
		if err == nil {
			_, err = parseConfig(u, func(string) string { return "" })
		}
		require.Error(t, err, raw)
		require.NotContains(t, err.Error(), "topsecret", raw)
	}
}

func TestDefaultInitiator(t *testing.T) {
	n := defaultInitiator()
	require.NoError(t, checkName(n))
	require.Regexp(t, `^iqn\.2026-01\.io\.github\.tierblk:[a-z0-9.-]+$`, n)
}
