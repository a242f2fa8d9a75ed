# test-failures.awk reads a `go test -v` log and prints, for each failed test, what the test
# itself reported (its t.Log/t.Error lines and testify's Error Trace/Error/Messages block), so
# that the last lines of `make test`, which are what CI keeps, say why a test failed.
#
# go test -v streams a test's reports as they happen, after "=== RUN/CONT/NAME <test>" lines that
# say whose they are; "--- FAIL: <test>" comes after them. The daemon's own log lines
# (time=... level=...) are left out: the whole log holds them.

function keep(name, line,    n) {
	n = count[name] % maxLines
	ring[name, n] = line
	count[name]++
}

BEGIN { maxLines = 12 }

/^=== (RUN|CONT|NAME|PAUSE) / { current = $3; reporting = 0; next }

/^ *--- FAIL: / {
	name = $3
	print "--- FAIL: " name " " $4
	first = count[name] > maxLines ? count[name] - maxLines : 0
	for (i = first; i < count[name]; i++) print ring[name, i % maxLines]
	next
}

/^ *--- (PASS|SKIP): / { reporting = 0; next }

# A report: "    file_test.go:123: message", then testify's lines indented further.
/^ +[A-Za-z0-9_.-]+_test\.go:[0-9]+: / { reporting = 1; keep(current, $0); next }
reporting && /^ +(\t|    )/ && !/ level=(DEBUG|INFO|WARN|ERROR) / { keep(current, $0); next }
{ reporting = 0 }
