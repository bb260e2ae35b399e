// Package specfile owns the strict decoding of InfraDev's YAML spec files (tasks, probes,
// environments) and the reporting of every problem in them with file, line and field.
//
// Decoding is two-step: Decode maps the YAML onto a Go struct, rejecting unknown fields and
// wrong types, and keeps the node tree so that later semantic checks can name the line of any
// field through Doc.Errorf. All problems are collected; none stops the others being found.
package specfile

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/infradev/infradev/harness/fault"
)

// FieldError is one problem in a spec file.
type FieldError struct {
	File  string
	Line  int    // 0 when unknown
	Field string // dotted path, e.g. "resources.memory"; empty for the whole file
	Msg   string
}

func (e FieldError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every problem found in one or more spec files, in file and line order.
type Errors []FieldError

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// FaultClass: a spec file's problems are the caller's input (package fault).
func (es Errors) FaultClass() fault.Class { return fault.Input }

// Err returns es as an error, or nil when there are no problems.
func (es Errors) Err() error {
	if len(es) == 0 {
		return nil
	}
	sort.SliceStable(es, func(i, j int) bool {
		if es[i].File != es[j].File {
			return es[i].File < es[j].File
		}
		return es[i].Line < es[j].Line
	})
	return es
}

// Doc is a decoded spec file: its name, its node tree and the problems found so far.
type Doc struct {
	File string
	root *yaml.Node
	Errs Errors
}

// ReadFile reads and decodes file into v; see Decode.
func ReadFile(file string, v any) *Doc {
	data, err := os.ReadFile(file)
	if err != nil {
		return &Doc{File: file, Errs: Errors{{File: file, Msg: err.Error()}}}
	}
	return Decode(file, data, v)
}

var lineRe = regexp.MustCompile(`^line (\d+): (.*)$`)
var unknownFieldRe = regexp.MustCompile(`^field (\S+) not found in type \S+$`)

// Decode decodes data (named file in messages) into v, rejecting unknown fields and values of
// the wrong type. Problems are recorded in the returned Doc's Errs, all of them.
func Decode(file string, data []byte, v any) *Doc {
	d := &Doc{File: file}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		d.addYAMLError(err)
		return d
	}
	if len(root.Content) == 0 {
		d.Errs = append(d.Errs, FieldError{File: file, Msg: "file is empty"})
		return d
	}
	d.root = root.Content[0]
	if d.root.Kind != yaml.MappingNode {
		d.Errs = append(d.Errs, FieldError{File: file, Line: d.root.Line, Msg: "top level must be a mapping"})
		return d
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		d.addYAMLError(err)
	}
	return d
}

func (d *Doc) addYAMLError(err error) {
	te, ok := err.(*yaml.TypeError)
	if !ok {
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		line := 0
		if m := lineRe.FindStringSubmatch(msg); m != nil {
			line, _ = strconv.Atoi(m[1])
			msg = m[2]
		}
		d.Errs = append(d.Errs, FieldError{File: d.File, Line: line, Msg: msg})
		return
	}
	for _, s := range te.Errors {
		fe := FieldError{File: d.File, Msg: s}
		if m := lineRe.FindStringSubmatch(s); m != nil {
			fe.Line, _ = strconv.Atoi(m[1])
			fe.Msg = m[2]
		}
		if m := unknownFieldRe.FindStringSubmatch(fe.Msg); m != nil {
			fe.Field = d.fieldAtLine(fe.Line, m[1])
			fe.Msg = "unknown field"
		} else if f := d.fieldAtLine(fe.Line, ""); f != "" {
			fe.Field = f
		}
		d.Errs = append(d.Errs, fe)
	}
}

// fieldAtLine finds the dotted path of the mapping key on line (named key, if given).
func (d *Doc) fieldAtLine(line int, key string) string {
	if d.root == nil || line == 0 {
		return key
	}
	var found string
	var walk func(n *yaml.Node, prefix string)
	walk = func(n *yaml.Node, prefix string) {
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, val := n.Content[i], n.Content[i+1]
				p := join(prefix, k.Value)
				if k.Line == line && (key == "" || k.Value == key) && found == "" {
					found = p
				}
				if val.Line == line && key == "" && found == "" && val.Kind == yaml.ScalarNode {
					found = p
				}
				walk(val, p)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				p := fmt.Sprintf("%s[%d]", prefix, i)
				if c.Line == line && c.Kind == yaml.ScalarNode && key == "" && found == "" {
					found = p
				}
				walk(c, p)
			}
		}
	}
	walk(d.root, "")
	if found == "" {
		return key
	}
	return found
}

func join(prefix, key string) string {
	if prefix == "" {
		return key
	}
	return prefix + "." + key
}

// Line returns the line of the field at a dotted path such as "tests.fail_to_pass[2]", or of the
// closest existing parent, or 0.
func (d *Doc) Line(path string) int {
	if d.root == nil {
		return 0
	}
	n, line := d.root, d.root.Line
	for _, part := range splitPath(path) {
		next, l := child(n, part)
		if next == nil {
			if l > 0 {
				return l
			}
			return line
		}
		n, line = next, l
	}
	return line
}

func splitPath(path string) []string {
	var parts []string
	for _, p := range strings.Split(path, ".") {
		for {
			i := strings.IndexByte(p, '[')
			if i < 0 {
				break
			}
			if i > 0 {
				parts = append(parts, p[:i])
			}
			j := strings.IndexByte(p, ']')
			if j < i {
				break
			}
			parts = append(parts, p[i:j+1])
			p = p[j+1:]
		}
		if p != "" {
			parts = append(parts, p)
		}
	}
	return parts
}

// child returns the node for one path part and the line to report for it (the key's line for
// mapping entries).
func child(n *yaml.Node, part string) (*yaml.Node, int) {
	if strings.HasPrefix(part, "[") {
		i, err := strconv.Atoi(strings.Trim(part, "[]"))
		if err != nil || n.Kind != yaml.SequenceNode || i < 0 || i >= len(n.Content) {
			return nil, 0
		}
		return n.Content[i], n.Content[i].Line
	}
	if n.Kind != yaml.MappingNode {
		return nil, 0
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == part {
			return n.Content[i+1], n.Content[i].Line
		}
	}
	return nil, 0
}

// Parsed reports whether the file was read and is a YAML mapping, so field checks make sense.
func (d *Doc) Parsed() bool { return d.root != nil && d.root.Kind == yaml.MappingNode }

// Errorf records a problem with the field at path (dotted, as for Line).
func (d *Doc) Errorf(path, format string, args ...any) {
	d.Errs = append(d.Errs, FieldError{File: d.File, Line: d.Line(path), Field: path, Msg: fmt.Sprintf(format, args...)})
}

// Has reports whether the field at path is present in the file.
func (d *Doc) Has(path string) bool {
	if d.root == nil {
		return false
	}
	n := d.root
	for _, part := range splitPath(path) {
		n, _ = child(n, part)
		if n == nil {
			return false
		}
	}
	return true
}
