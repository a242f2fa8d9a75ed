package iscsi

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNegotiation(t *testing.T) {
	// tgtd's answers to our offer, as seen in the integration tests.
	tgtd := []pair{
		{"HeaderDigest", "None"}, {"DataDigest", "None"}, {"MaxConnections", "1"}, {"InitialR2T", "Yes"},
		{"ImmediateData", "Yes"}, {"MaxRecvDataSegmentLength", "8192"}, {"MaxBurstLength", "262144"},
		{"FirstBurstLength", "65536"}, {"DefaultTime2Wait", "2"}, {"DefaultTime2Retain", "0"},
		{"MaxOutstandingR2T", "1"}, {"DataPDUInOrder", "Yes"}, {"DataSequenceInOrder", "Yes"},
		{"ErrorRecoveryLevel", "0"}, {"TargetAlias", "disk"},
	}
	with := func(ps ...pair) []pair {
		out := append([]pair(nil), tgtd...)
	next:
		for _, p := range ps {
			for i := range out {
				if out[i].key == p.key {
					out[i] = p
					continue next
				}
			}
			out = append(out, p)
		}
		return out
	}
	for _, c := range []struct {
		name             string
		hd, dd           bool
		answers          []pair
		want             params
		replies          []pair
		applyErr, parErr string
	}{
		{name: "tgtd", answers: tgtd, want: params{maxRecvData: ourMaxRecvData, maxSendData: 8192, maxBurst: 262144,
			firstBurst: 65536, initialR2T: true, immediateData: true, maxOutstandingR2T: 1}},
		{name: "no answers: RFC defaults", answers: nil, want: params{maxRecvData: ourMaxRecvData, maxSendData: 8192,
			maxBurst: 262144, firstBurst: 65536, initialR2T: true, immediateData: true, maxOutstandingR2T: 1}},
		{name: "digests agreed", hd: true, dd: true, answers: with(pair{"HeaderDigest", "CRC32C"}, pair{"DataDigest", "crc32c"}),
			want: params{headerDigest: true, dataDigest: true, maxRecvData: ourMaxRecvData, maxSendData: 8192, maxBurst: 262144,
				firstBurst: 65536, initialR2T: true, immediateData: true, maxOutstandingR2T: 1}},
		{name: "larger values are capped at ours", answers: with(pair{"MaxBurstLength", "16777215"}, pair{"FirstBurstLength", "0x100000"},
			pair{"MaxOutstandingR2T", "8"}, pair{"InitialR2T", "No"}, pair{"MaxRecvDataSegmentLength", "1048576"}),
			want: params{maxRecvData: ourMaxRecvData, maxSendData: 1 << 20, maxBurst: ourMaxBurst,
				firstBurst: ourFirstBurst, immediateData: true, maxOutstandingR2T: 1}},
		{name: "rejected and irrelevant keys take the default", answers: with(pair{"ImmediateData", "Reject"}, pair{"MaxBurstLength", "Irrelevant"}),
			want: params{maxRecvData: ourMaxRecvData, maxSendData: 8192, maxBurst: 262144, firstBurst: 65536,
				initialR2T: true, immediateData: true, maxOutstandingR2T: 1}},
		{name: "a key of the target's own is answered", answers: with(pair{"X-com.example.Foo", "1"}, pair{"OFMarker", "Yes"}),
			want: params{maxRecvData: ourMaxRecvData, maxSendData: 8192, maxBurst: 262144, firstBurst: 65536,
				initialR2T: true, immediateData: true, maxOutstandingR2T: 1},
			replies: []pair{{"X-com.example.Foo", "NotUnderstood"}, {"OFMarker", "NotUnderstood"}}},

		{name: "digest refused", hd: true, answers: tgtd, applyErr: "the target answered HeaderDigest=None to our CRC32C"},
		{name: "digest not answered", dd: true, answers: nil, parErr: "the target did not agree to DataDigest=CRC32C (the outcome is None)"},
		{name: "digest not offered", answers: with(pair{"DataDigest", "CRC32C"}), applyErr: "the target answered DataDigest=CRC32C to our None"},
		{name: "not a number", answers: with(pair{"MaxBurstLength", "lots"}), applyErr: "MaxBurstLength=lots is not a number from 512 to 16777215"},
		{name: "below the minimum", answers: with(pair{"MaxRecvDataSegmentLength", "100"}), applyErr: "MaxRecvDataSegmentLength=100 is not a number"},
		{name: "not Yes or No", answers: with(pair{"InitialR2T", "Maybe"}), applyErr: "InitialR2T=Maybe is neither Yes nor No"},
		{name: "first burst over max burst", answers: with(pair{"MaxBurstLength", "4096"}), parErr: "FirstBurstLength 65536 exceeds MaxBurstLength 4096"},
		{name: "error recovery", answers: with(pair{"ErrorRecoveryLevel", "3"}), applyErr: "ErrorRecoveryLevel=3 is not a number from 0 to 2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newNegotiation(c.hd, c.dd)
			replies, err := n.apply(c.answers)
			if c.applyErr != "" {
				require.ErrorIs(t, err, ErrProtocol)
				require.ErrorContains(t, err, c.applyErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.replies, replies)
			p, err := n.params()
			if c.parErr != "" {
				require.ErrorContains(t, err, c.parErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, p)
		})
	}
}

// A target that offers a negotiable key we left out gets our answer: the outcome of the key's
// function between the default and its value.
func TestNegotiationAnswersTargetOffers(t *testing.T) {
	n := &negotiation{ours: map[string]string{}, results: map[string]string{}}
	replies, err := n.apply([]pair{{"MaxBurstLength", "4096"}, {"ImmediateData", "No"}, {"DataDigest", "CRC32C,None"}, {"HeaderDigest", "CRC32C"}})
	require.NoError(t, err)
	require.Equal(t, []pair{{"MaxBurstLength", "4096"}, {"ImmediateData", "No"}, {"DataDigest", "None"}, {"HeaderDigest", "Reject"}}, replies)
}
