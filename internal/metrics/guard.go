package metrics

import (
	"net"
	"net/http"
	"strings"
)

// guard refuses the requests a web page open in a browser on this host could make to the admin
// endpoint: a cross-origin POST (a form or a fetch from any site: http.CrossOriginProtection, by
// the browser's Sec-Fetch-Site or Origin header), and, over TCP, any request naming a host other
// than the loopback's (DNS rebinding: a site whose name resolves to 127.0.0.1 would otherwise be
// same-origin). The CLI, curl and Prometheus send neither header and name the loopback address; a
// unix socket cannot be reached from a browser, so its Host is not looked at.
func guard(h http.Handler) http.Handler {
	csrf := http.NewCrossOriginProtection()
	return csrf.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if overTCP(r) && !loopbackHost(r.Host) {
			http.Error(w, "the admin endpoint answers requests for localhost or a loopback address only, not "+r.Host, http.StatusMisdirectedRequest)
			return
		}
		h.ServeHTTP(w, r)
	}))
}

// overTCP reports whether r came over TCP (its remote address is an IP and port).
func overTCP(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	return err == nil && net.ParseIP(host) != nil
}

func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
