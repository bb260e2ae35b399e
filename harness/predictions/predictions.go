// Package predictions owns reading submissions: JSON Lines files with SWE-bench's field names
// (instance_id, model_name_or_path, model_patch), checked line by line before anything runs.
// A line is read with a size limit (a huge line is refused without being held in memory);
// every field must be known, present and valid UTF-8; a model name must be usable as a folder
// name, and names are mapped to folders one to one (Folder), so two models never share one.
package predictions

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/infradev/infradev/harness/specfile"
)

// Prediction is one model's patch for one task instance.
type Prediction struct {
	InstanceID string `json:"instance_id"`
	Model      string `json:"model_name_or_path"`
	Patch      string `json:"model_patch"`
	// PromptVariant and Attempt are InfraDev's optional fields for an agent's runs: the prompt
	// the patch was made from and which of repeated attempts it is (from 1). A file may hold
	// one prediction per (model, instance, variant, attempt).
	PromptVariant string `json:"prompt_variant,omitempty"`
	Attempt       int    `json:"attempt,omitempty"`
	// Line is the line of the file it was read from.
	Line int `json:"-"`
}

// MaxLineBytes bounds one line of a predictions file: a 16 MiB patch (the runner's limit)
// escaped as JSON, with room to spare. Longer lines are refused unread.
const MaxLineBytes = 64 << 20

var idRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// VariantRe is what a prompt variant's name must match (e.g. instruction, instruction+skill).
var VariantRe = regexp.MustCompile(`^[a-z][a-z0-9_]*(\+[a-z][a-z0-9_]*)*$`)

// MaxAttempts bounds an attempt number.
const MaxAttempts = 1000

// Read reads a predictions file. Every bad line is reported with its number and field; a model
// that submits twice for one instance is an error.
func Read(file string) ([]Prediction, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Prediction
	var errs specfile.Errors
	bad := func(line int, field, format string, args ...any) {
		errs = append(errs, specfile.FieldError{File: file, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
	}
	seen := map[Key]int{}
	br := bufio.NewReaderSize(f, 1<<20)
	for line := 1; ; line++ {
		text, size, err := readLine(br, MaxLineBytes)
		if errors.Is(err, io.EOF) && size == 0 {
			break
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s:%d: %w", file, line, err)
		}
		if size > MaxLineBytes {
			bad(line, "", "the line is %d bytes, over the %d-byte limit for one prediction", size, MaxLineBytes)
			continue
		}
		text = bytes.TrimSpace(text)
		if len(text) == 0 {
			continue
		}
		if !utf8.Valid(text) {
			bad(line, "", "not valid UTF-8 (at byte %d)", invalidAt(text))
			continue
		}
		if field := loneSurrogate(text); field != "" {
			bad(line, field, "holds an unpaired UTF-16 surrogate escape, which is not text")
			continue
		}
		var p Prediction
		dec := json.NewDecoder(bytes.NewReader(text))
		dec.DisallowUnknownFields()
		var raw map[string]json.RawMessage
		if err := json.Unmarshal(text, &raw); err != nil {
			bad(line, "", "not a JSON object: %v", err)
			continue
		}
		if err := dec.Decode(&p); err != nil {
			bad(line, fieldOf(err), "%v", err)
			continue
		}
		p.Line = line
		for _, f := range []string{"instance_id", "model_name_or_path", "model_patch"} {
			if _, ok := raw[f]; !ok {
				bad(line, f, "is required")
			}
		}
		if _, ok := raw["instance_id"]; ok && !idRe.MatchString(p.InstanceID) {
			bad(line, "instance_id", "must match %s, got %q", idRe, p.InstanceID)
		}
		if _, ok := raw["model_name_or_path"]; ok {
			if msg := CheckModel(p.Model); msg != "" {
				bad(line, "model_name_or_path", "%s", msg)
			}
		}
		if _, ok := raw["prompt_variant"]; ok && !VariantRe.MatchString(p.PromptVariant) {
			bad(line, "prompt_variant", "must match %s, got %q", VariantRe, p.PromptVariant)
		}
		if _, ok := raw["attempt"]; ok && (p.Attempt < 1 || p.Attempt > MaxAttempts) {
			bad(line, "attempt", "must be 1 to %d, got %d", MaxAttempts, p.Attempt)
		}
		key := p.Key()
		if first, dup := seen[key]; dup {
			bad(line, "instance_id", "%s already has a prediction from %s on line %d", p.InstanceID, p.Model, first)
		}
		seen[key] = line
		out = append(out, p)
	}
	if err := errs.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// readLine reads one line (without its newline). A line longer than limit is read through and
// dropped: the returned size says how long it was.
func readLine(br *bufio.Reader, limit int) ([]byte, int, error) {
	var buf []byte
	size := 0
	for {
		chunk, err := br.ReadSlice('\n')
		size += len(chunk)
		if size <= limit+1 {
			buf = append(buf, chunk...)
		} else {
			buf = nil
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if bytes.HasSuffix(buf, []byte("\n")) {
			buf = buf[:len(buf)-1]
			size--
		}
		return buf, size, err
	}
}

func invalidAt(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i + 1
		}
		i += n
	}
	return 0
}

var surrogateRe = regexp.MustCompile(`\\u[dD][89abAB][0-9a-fA-F]{2}(\\u[dD][c-fC-F][0-9a-fA-F]{2})?|\\u[dD][c-fC-F][0-9a-fA-F]{2}`)

// loneSurrogate finds a \uD800-\uDFFF escape that is not part of a pair: encoding/json turns it
// silently into U+FFFD, so the patch would not be what was submitted. It returns the field (or
// "line") that holds one, "" when none.
func loneSurrogate(text []byte) string {
	for _, m := range surrogateRe.FindAll(text, -1) {
		if len(m) != 12 { // a pair is two 6-byte escapes; anything else is unpaired
			return "model_patch"
		}
	}
	return ""
}

func fieldOf(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return te.Field
	}
	if s := err.Error(); strings.HasPrefix(s, "json: unknown field ") {
		return strings.Trim(strings.TrimPrefix(s, "json: unknown field "), `"`)
	}
	return ""
}

// CheckModel says what is wrong with a model name, or "". A name may hold slashes
// ("org/model"), but no empty, "." or ".." part, no control characters and no backslash.
func CheckModel(m string) string {
	if m == "" {
		return "is required"
	}
	for _, r := range m {
		if unicode.IsControl(r) || r == '\\' {
			return fmt.Sprintf("%q holds a control character or backslash", m)
		}
	}
	for _, part := range strings.Split(m, "/") {
		if part == "" || part == "." || part == ".." {
			return fmt.Sprintf("%q has an empty, \".\" or \"..\" path part", m)
		}
	}
	return ""
}

// Key is what a prediction is one of per file and per run: its model, instance, prompt
// variant and attempt.
type Key struct {
	Model, InstanceID, PromptVariant string
	Attempt                          int
}

// Key returns p's key.
func (p Prediction) Key() Key { return Key{p.Model, p.InstanceID, p.PromptVariant, p.Attempt} }

// ModelFolder is the run folder level that holds a prediction's model: Folder(model) for a
// plain prediction; for an agent's attempt, Folder(model)@Folder(variant)@attempt, one to one
// because Folder never writes '@'.
func (p Prediction) ModelFolder() string {
	if p.PromptVariant == "" && p.Attempt == 0 {
		return Folder(p.Model)
	}
	return fmt.Sprintf("%s@%s@%d", Folder(p.Model), Folder(p.PromptVariant), p.Attempt)
}

// Folder maps a model name (or run id, or instance id) to one folder name, one to one: ASCII
// letters, digits, '.', '-' and '_' are kept, every other byte is written as %XX, so "a/b" and
// "a_b" never share a folder. Names CheckModel accepts never map to "", "." or "..".
func Folder(name string) string {
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '-', c == '_':
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}
