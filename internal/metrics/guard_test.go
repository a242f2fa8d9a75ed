package metrics

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGuard: what a web page in a browser on this host could send is refused (a cross-site POST,
// by Sec-Fetch-Site or by Origin; over TCP, a request naming another host, as DNS rebinding
// makes), and what the CLI, curl and Prometheus send is served.
func TestGuard(t *testing.T) {
	h := NewHandler(func() []Source { return nil })
	for _, tc := range []struct {
		name, method, remote, host string
		headers                    map[string]string
		want                       int
	}{
		{"the CLI over TCP", "POST", "127.0.0.1:5000", "127.0.0.1:9810", nil, http.StatusNotFound},
		{"the CLI over a unix socket", "POST", "@", "tierblk-admin", nil, http.StatusNotFound},
		{"curl on a unix socket", "GET", "", "x", nil, http.StatusOK},
		{"Prometheus", "GET", "127.0.0.1:5000", "localhost:9810", nil, http.StatusOK},
		{"IPv6 loopback", "GET", "[::1]:5000", "[::1]:9810", nil, http.StatusOK},
		{"a cross-site form", "POST", "127.0.0.1:5000", "127.0.0.1:9810", map[string]string{"Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		{"another origin", "POST", "127.0.0.1:5000", "127.0.0.1:9810", map[string]string{"Origin": "http://evil.example"}, http.StatusForbidden},
		{"DNS rebinding", "GET", "127.0.0.1:5000", "evil.example:9810", map[string]string{"Origin": "http://evil.example:9810"}, http.StatusMisdirectedRequest},
		{"DNS rebinding, a POST", "POST", "127.0.0.1:5000", "evil.example:9810", map[string]string{"Sec-Fetch-Site": "same-origin"}, http.StatusMisdirectedRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target := "/stats"
			if tc.method == "POST" {
				target = "/flush?export=none" // no such export: 404 once let through
			}
			req := httptest.NewRequest(tc.method, target, nil)
			req.RemoteAddr, req.Host = tc.remote, tc.host
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			require.Equal(t, tc.want, rec.Code, rec.Body.String())
		})
	}
}
