// Package patchread owns the static reading of a submission for the failure analysis: which test
// files a patch adds or changes and what the added test code measures (memory, time, collective
// traffic), and how close the non-test code a patch adds is to another patch's, so a submission
// that reproduces the upstream change near-verbatim can be told apart from one that solved the
// task. It reads the diff only; nothing is applied or run.
package patchread

import (
	"bytes"
	"fmt"
	"path"
	"sort"
	"strings"

	"github.com/bluekeyes/go-gitdiff/gitdiff"
)

// Contaminated is the threshold above which a submission is read as reproducing the upstream
// change near-verbatim.
const Contaminated = 0.9

// AddedTest is one test file a submission adds or changes, with the lines it adds.
type AddedTest struct {
	Path  string `json:"path"`
	New   bool   `json:"new"`   // the file did not exist before
	Lines int    `json:"lines"` // added lines
	// Checks are what the added code measures, sorted, from {"memory","time","traffic"}.
	Checks []string `json:"checks,omitempty"`
	// Evidence maps each check to the first added line (trimmed, at most 120 chars) that showed it.
	Evidence map[string]string `json:"evidence,omitempty"`
}

// IsTest reports whether path is a test file under the rules the harness applies to official
// tests (upstream.DefaultTests): anything under a tests/ or test/ directory, pytest modules and
// conftest files, and Go test files. It is matched here by segment rather than by glob so the
// reading stays independent of the glob library.
func IsTest(p string) bool {
	for _, seg := range strings.Split(p, "/") {
		if seg == "tests" || seg == "test" {
			return true
		}
	}
	base := path.Base(p)
	return base == "conftest.py" ||
		strings.HasPrefix(base, "test_") && strings.HasSuffix(base, ".py") ||
		strings.HasSuffix(base, "_test.py") || strings.HasSuffix(base, "_test.go")
}

// Tests reads a patch and returns the test files it adds or changes (sorted by path; deleted
// files and binary files are left out). An unparsable patch is an error.
func Tests(patch []byte) ([]AddedTest, error) {
	files, err := parse(patch)
	if err != nil {
		return nil, err
	}
	var out []AddedTest
	for _, f := range files {
		if f.IsDelete || f.IsBinary || !IsTest(f.NewName) {
			continue
		}
		// A copy puts a file where none was, so for the analysis it is as new as an added one.
		t := AddedTest{Path: f.NewName, New: f.IsNew || f.IsCopy}
		var r reader
		for _, frag := range f.TextFragments {
			t.Lines += int(frag.LinesAdded)
			// Context lines go in too: they carry the docstring state the added lines sit in.
			var lines []string
			var added []bool
			for _, l := range frag.Lines {
				if l.New() {
					lines = append(lines, strings.TrimRight(l.Line, "\r\n"))
					added = append(added, l.Op == gitdiff.OpAdd)
				}
			}
			r.read(lines, added)
		}
		t.Checks, t.Evidence = r.result()
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// Checks classifies lines of (Python, mostly PyTorch) test code by what they measure; the
// vocabulary is listed at measures. Comments and docstrings are not read, so prose about memory
// or latency is not taken for a measurement.
func Checks(lines []string) (checks []string, evidence map[string]string) {
	var r reader
	r.read(lines, nil)
	return r.result()
}

// Similarity is a token-level similarity in [0,1] between the non-test code two patches add
// (added lines of non-test files only, comments `#...` stripped): 2*LCS/(len(a)+len(b)) over
// their token sequences, as difflib's ratio is defined. Both empty → 0 (nothing to compare).
//
// Files are taken in path order so the order a tool happened to emit them in does not count;
// hunks keep their order, which is part of how alike two changes are. Test files are left out
// because the agent is asked to add tests of its own, which must not dilute the comparison.
func Similarity(a, b []byte) (float64, error) {
	ta, err := addedTokens(a)
	if err != nil {
		return 0, fmt.Errorf("first patch: %w", err)
	}
	tb, err := addedTokens(b)
	if err != nil {
		return 0, fmt.Errorf("second patch: %w", err)
	}
	if len(ta)+len(tb) == 0 {
		return 0, nil
	}
	// LCS is quadratic in time; past maxLCS tokens a side it would take seconds to minutes per
	// pair, so large patches are compared on 4-gram multisets, which keeps near-verbatim copies
	// near 1 and unrelated code near 0 in linear time.
	if len(ta) > maxLCS || len(tb) > maxLCS {
		return ngramRatio(ta, tb, 4), nil
	}
	return 2 * float64(lcs(intern(ta, tb))) / float64(len(ta)+len(tb)), nil
}

// intern numbers the tokens of a and b alike, so the quadratic loop compares integers.
func intern(a, b []string) ([]int32, []int32) {
	ids := map[string]int32{}
	conv := func(toks []string) []int32 {
		out := make([]int32, len(toks))
		for i, t := range toks {
			id, ok := ids[t]
			if !ok {
				id = int32(len(ids))
				ids[t] = id
			}
			out[i] = id
		}
		return out
	}
	return conv(a), conv(b)
}

const maxLCS = 20000

// parse reads a git diff. Text that holds no file diff at all is refused rather than read as an
// empty change, so a truncated or mangled submission is not mistaken for one that did nothing.
func parse(patch []byte) ([]*gitdiff.File, error) {
	files, _, err := gitdiff.Parse(bytes.NewReader(patch))
	if err != nil {
		return nil, fmt.Errorf("parse patch: %w", err)
	}
	if len(files) == 0 && len(bytes.TrimSpace(patch)) > 0 {
		return nil, fmt.Errorf("parse patch: no file diff in %d bytes", len(patch))
	}
	return files, nil
}

func addedTokens(patch []byte) ([]string, error) {
	files, err := parse(patch)
	if err != nil {
		return nil, err
	}
	sort.SliceStable(files, func(i, j int) bool { return files[i].NewName < files[j].NewName })
	var toks []string
	for _, f := range files {
		if f.IsBinary || IsTest(f.NewName) {
			continue
		}
		for _, frag := range f.TextFragments {
			for _, l := range frag.Lines {
				if l.Op == gitdiff.OpAdd {
					toks = tokenize(stripComment(l.Line), toks)
				}
			}
		}
	}
	return toks, nil
}

// tokenize appends the tokens of one line of code: identifiers and keywords, numbers and string
// literals each as one token, any other non-space character alone.
func tokenize(s string, toks []string) []string {
	for i := 0; i < len(s); {
		c := s[i]
		j := i + 1
		switch {
		case c <= ' ':
			i = j
			continue
		case isWord(c):
			for j < len(s) && (isWord(s[j]) || c >= '0' && c <= '9' && s[j] == '.') {
				j++
			}
		case c == '"' || c == '\'':
			for j < len(s) && s[j] != c {
				if s[j] == '\\' {
					j++
				}
				j++
			}
			j = min(j+1, len(s))
		}
		toks = append(toks, s[i:j])
		i = j
	}
	return toks
}

// isWord takes any non-ASCII byte as part of a word, so a name or text in another script stays
// one token.
func isWord(c byte) bool {
	return c == '_' || c >= 0x80 || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// stripComment cuts a Python `#` comment, leaving a `#` inside a string literal alone.
func stripComment(s string) string {
	var quote byte
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quote != 0 && c == '\\':
			i++
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
		case c == '#':
			return s[:i]
		}
	}
	return s
}

// lcs is the length of the longest common subsequence, in two rows so memory stays linear.
func lcs(a, b []int32) int {
	if len(a) < len(b) {
		a, b = b, a
	}
	prev := make([]int32, len(b)+1)
	cur := make([]int32, len(b)+1)
	for i := range a {
		for j := range b {
			switch {
			case a[i] == b[j]:
				cur[j+1] = prev[j] + 1
			case prev[j+1] >= cur[j]:
				cur[j+1] = prev[j+1]
			default:
				cur[j+1] = cur[j]
			}
		}
		prev, cur = cur, prev
	}
	return int(prev[len(b)])
}

// ngramRatio is 2*|A∩B|/(|A|+|B|) over the multisets of n-grams of a and b.
func ngramRatio(a, b []string, n int) float64 {
	grams := func(t []string) map[string]int {
		m := map[string]int{}
		for i := 0; i+n <= len(t); i++ {
			m[strings.Join(t[i:i+n], "\x00")]++
		}
		return m
	}
	ga, gb := grams(a), grams(b)
	total := max(len(a)-n+1, 0) + max(len(b)-n+1, 0)
	if total == 0 {
		return 0
	}
	common := 0
	for g, ca := range ga {
		common += min(ca, gb[g])
	}
	return 2 * float64(common) / float64(total)
}
