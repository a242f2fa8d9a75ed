package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// decode reads the YAML in data into c. yaml.v3's own errors name a Go type and no field
// ("field ssd_sise not found in type config.Cache", "cannot unmarshal !!str into []string"), so the
// file is first read as a tree of nodes and checked against c's type; each error then gives the
// file, the line, the field's YAML path and what would be valid, and all of them come at once.
func decode(data []byte, name string, c *Config) error {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // no document: the defaults
		}
		return syntaxError(data, name, err)
	}
	// A second document would be ignored: settings the user wrote, silently not taken.
	var more yaml.Node
	if err := dec.Decode(&more); err == nil && len(more.Content) > 0 && more.Content[0].ShortTag() != "!!null" {
		return fmt.Errorf("config %s:%d: a second YAML document begins here (---); a config is one document: put its settings in the first", name, more.Line)
	}
	k := checker{file: name}
	for _, n := range doc.Content { // the document's one root node
		k.value(n, reflect.TypeOf(c).Elem(), "")
	}
	if len(k.errs) > 0 {
		return errors.Join(k.errs...)
	}
	// The check found every key known and every value of its field's kind; whatever yaml.v3 still
	// refuses is reported as it words it.
	if err := doc.Decode(c); err != nil {
		return fmt.Errorf("config %s: %s", name, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	return nil
}

// checker walks a YAML tree against the Go type it is to be decoded into.
type checker struct {
	file string
	errs []error
}

// fail records an error about the node n at the field path (empty: the whole file).
func (k *checker) fail(n *yaml.Node, path, format string, args ...any) {
	var err error = fieldErr(path, format, args...)
	if path == "" {
		err = fmt.Errorf(format, args...)
	}
	k.errs = append(k.errs, fmt.Errorf("config %s:%d: %w", k.file, n.Line, err))
}

// value checks n against t, the type of the field at path: its shape (a mapping for a struct, a list
// for a slice, else a single value that decodes as t), and its keys.
func (k *checker) value(n *yaml.Node, t reflect.Type, path string) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return // as if absent: the zero value
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind == yaml.MappingNode {
			k.mapping(n, t, path)
		} else if path == "" {
			k.fail(n, "", "the file must be a mapping of settings (%s), not %s", strings.Join(fieldNames(t), ", "), describe(n))
		} else {
			key := lastKey(path)
			k.fail(n, path, "expected a mapping of its fields, not %s; write `%s: {}` for the defaults, or `field: value` lines indented under %s:",
				describe(n), key, key)
		}
	case reflect.Slice:
		if n.Kind == yaml.SequenceNode {
			for i, item := range n.Content {
				k.value(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
			}
			return
		}
		k.fail(n, path, "expected a list, not %s; %s", describe(n), listHint(n, t.Elem(), lastKey(path)))
	default:
		if n.Kind != yaml.ScalarNode {
			k.fail(n, path, "expected %s, not %s (quote a value that holds \": \" or starts with [ or {)", kindWants(t), describe(n))
		} else if err := n.Decode(reflect.New(t).Interface()); err != nil {
			k.fail(n, path, "%q is not %s", n.Value, kindWants(t))
		}
	}
}

// mapping checks the keys of n, a mapping, against the struct t: each known, and given once.
func (k *checker) mapping(n *yaml.Node, t reflect.Type, path string) {
	fields := map[string]reflect.Type{}
	for i := range t.NumField() {
		if name := yamlName(t.Field(i)); name != "" {
			fields[name] = t.Field(i).Type
		}
	}
	seen := map[string]int{} // key: its line
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		if key.ShortTag() == "!!merge" { // <<: *anchor merges a mapping, or a list of them, into this one
			if val.Kind == yaml.AliasNode {
				val = val.Alias
			}
			if val.Kind == yaml.SequenceNode {
				for _, m := range val.Content {
					k.value(m, t, path)
				}
			} else {
				k.value(val, t, path)
			}
			continue
		}
		p := key.Value
		if path != "" {
			p = path + "." + key.Value
		}
		if first, dup := seen[key.Value]; dup {
			k.fail(key, p, "given twice (first on line %d); keep one", first)
			continue
		}
		seen[key.Value] = key.Line
		ft, ok := fields[key.Value]
		if !ok {
			k.fail(key, p, "unknown field; %s", suggest(key.Value, fieldNames(t), path))
			continue
		}
		k.value(val, ft, p)
	}
}

// yamlName is the key of a struct field, as yaml.v3 derives it; empty for none. The config's types
// use neither inline fields nor flags beyond the name.
func yamlName(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	switch name {
	case "-":
		return ""
	case "":
		return strings.ToLower(f.Name)
	}
	return name
}

func fieldNames(t reflect.Type) []string {
	var names []string
	for i := range t.NumField() {
		if name := yamlName(t.Field(i)); name != "" {
			names = append(names, name)
		}
	}
	return names
}

// suggest names the valid key closest to key when it is close enough to be a typo, else them all.
func suggest(key string, valid []string, path string) string {
	best, bestD := "", len(key)
	for _, v := range valid {
		if d := editDistance(strings.ToLower(key), v); d < bestD {
			best, bestD = v, d
		}
	}
	if best != "" && bestD <= max(1, len(key)/3) {
		return "did you mean " + best + "?"
	}
	where := "the top-level fields"
	if path != "" {
		where = "the fields of " + path
	}
	return where + " are " + strings.Join(valid, ", ")
}

// editDistance counts the insertions, deletions, substitutions and swaps of neighbours that turn a
// into b (optimal string alignment), so that "ssd_sise", "ssd-size" and "ssd_szie" are one edit
// from ssd_size.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// kindWants says what a scalar field takes.
func kindWants(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int:
		return "a whole number"
	case reflect.Float64:
		return "a number"
	}
	return "a single value"
}

// describe says what a node is, for "expected X, not Y".
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return fmt.Sprintf("the single value %q", n.Value)
}

// listHint says how to write a list where n, the value of key, is something else.
func listHint(n *yaml.Node, elem reflect.Type, key string) string {
	for elem.Kind() == reflect.Pointer {
		elem = elem.Elem()
	}
	switch {
	case elem.Kind() == reflect.Struct && n.Kind == yaml.MappingNode && len(n.Content) > 0:
		return fmt.Sprintf("begin each item with \"- \": `- %s: ...` under %s:, the item's other fields indented to line up with %s",
			n.Content[0].Value, key, n.Content[0].Value)
	case elem.Kind() == reflect.Struct:
		return fmt.Sprintf("write one `- field: value` item per line under %s:", key)
	case n.Kind == yaml.ScalarNode:
		return fmt.Sprintf("write `%s: [%s]`, or a `- %s` line per item under %s:", key, n.Value, n.Value, key)
	}
	return fmt.Sprintf("write `%s: [a, b]`, or a `- item` line per item under %s:", key, key)
}

// lastKey is the last key of a field path: "listen" of "listen", "cache" of "exports[0].cache".
func lastKey(path string) string {
	path = path[strings.LastIndex(path, ".")+1:]
	if i := strings.IndexByte(path, '['); i >= 0 {
		path = path[:i]
	}
	return path
}

// yamlLine matches the line yaml.v3 puts before a syntax error's message.
var yamlLine = regexp.MustCompile(`^yaml: (?:line (\d+): )?`)

// syntaxError places a YAML syntax error on the line of what is wrong, and words the commonest in
// the config's terms.
func syntaxError(data []byte, name string, err error) error {
	msg := err.Error()
	m := yamlLine.FindStringSubmatch(msg)
	if m == nil {
		return fmt.Errorf("config %s: %s", name, msg)
	}
	problem := msg[len(m[0]):]
	from, _ := strconv.Atoi(m[1]) // 0 when yaml.v3 gave no line
	if problem == "found unexpected end of stream" {
		return fmt.Errorf("config %s:%d: a quoted value is not closed: the file ends inside it", name, quoteLine(data))
	}
	line := problemLine(data, problem, from)
	if problem == "found a tab character that violates indentation" ||
		problem == "found character that cannot start any token" && lineStart(data, line) == '\t' {
		problem = "a tab in the indentation; YAML indents with spaces only"
	}
	return fmt.Errorf("config %s:%d: %s", name, line, problem)
}

// problemLine finds the line where the parser found the problem of a syntax error that yaml.v3
// reported on line from. yaml.v3 reports the line of the construct it was inside instead (the
// scalar, the collection: decode.go's fail), and for the parser's own errors counts that line from
// 0, so a tab on line 3 that breaks the value begun on line 2 comes as "line 2". The problem is on
// or after that line, which is what both ways of counting give at least. The parser reads in order,
// so a prefix of the file that holds the problem's line fails with the same message, and one that
// ends before it does not (it ends where the file was still well formed): the first such prefix,
// from the reported line on, ends on the problem's line.
func problemLine(data []byte, problem string, from int) int {
	line, end := 0, 0
	for end < len(data) {
		if nl := bytes.IndexByte(data[end:], '\n'); nl >= 0 {
			end += nl + 1
		} else {
			end = len(data)
		}
		line++
		if line >= from && sameSyntaxError(data[:end], problem) {
			return line
		}
	}
	return max(1, min(from, line)) // a message that no prefix gives: yaml.v3's line, within the file
}

// quoteLine finds the line of the quote that a file ending inside a quoted value opened. yaml.v3
// reports that line (the error's context) unless it is the first, line 0 to the parser, which
// decode.go's fail takes for none: it then gives the end's line. With a blank line in front of the
// file the context is never on line 0, and its line is one more than in the file.
func quoteLine(data []byte) int {
	var n yaml.Node
	err := yaml.Unmarshal(append([]byte("\n"), bytes.TrimPrefix(data, []byte("\ufeff"))...), &n)
	if err != nil {
		if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
			if line, _ := strconv.Atoi(m[1]); line > 1 {
				return line - 1
			}
		}
	}
	return 1
}

// sameSyntaxError reports whether data fails to parse with the message problem.
func sameSyntaxError(data []byte, problem string) bool {
	var n yaml.Node
	err := yaml.Unmarshal(data, &n)
	return err != nil && strings.HasSuffix(err.Error(), ": "+problem)
}

// lineStart is the first byte of the 1-based line that is not a space, 0 if none.
func lineStart(data []byte, line int) byte {
	lines := bytes.Split(data, []byte("\n"))
	if line < 1 || line > len(lines) {
		return 0
	}
	if t := bytes.TrimLeft(lines[line-1], " "); len(t) > 0 {
		return t[0]
	}
	return 0
}
