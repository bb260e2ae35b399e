// Package canary owns the canary tests planted among an attempt's official tests. The official
// tests run in the same process as the submission's code, which can rewrite assertion helpers,
// the test runner or its report in memory; a forged outcome cannot be told from a real one by
// looking at it. So each attempt plants tests among the official ones, some that must pass and
// some that must fail, written in several assertion styles (plain assert, numpy.testing,
// numpy.allclose, unittest, pytest.raises, torch.testing). Their expected outcomes never leave
// the harness. A canary with the wrong outcome, or missing from a report in which the official
// tests passed, shows that outcomes were forged.
//
// A canary must look like the file's own tests to code that knows how canaries are made: the
// setup script names each one with a word chain drawn from the bigrams of the file's own test
// names and puts it before one of the file's top-level tests or at its end, from a seed drawn
// here (so the names exist only once the file is read), and reports the node ids back; the ids
// reach the report plugin through its sealed channel, never a file.
package canary

import (
	"crypto/rand"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math/big"
	"sort"
)

// Outcomes a canary must get.
const (
	Pass = "passed"
	Fail = "failed"
)

// Styles are the assertion styles canaries use; every set has a must-fail canary of each.
var Styles = []string{"assert", "numpy.testing", "numpy.allclose", "unittest", "pytest.raises", "torch.testing"}

// Set is one attempt's canaries.
type Set struct {
	// Plants are what the setup script plants, in order; their node ids are known only once
	// it has (Resolve).
	Plants []Plant `json:"plants"`
	// Want maps each canary's pytest node id to the outcome it must get.
	Want map[string]string `json:"want"`
	// Style maps each canary's node id to its assertion style (for messages).
	Style map[string]string `json:"style"`
}

// IDs returns the canaries' node ids, sorted (after Resolve).
func (s *Set) IDs() []string {
	ids := make([]string, 0, len(s.Want))
	for id := range s.Want {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Plant is one canary for the setup script: the file it goes into, its body with the names
// left as placeholders (__CANARY_NAME__ for a test function, __CANARY_CLASS__ and
// __CANARY_METHOD__ for a unittest case), and the seed its name and place are drawn from.
type Plant struct {
	File string `json:"file"`
	Kind string `json:"kind"` // "function" or "class"
	Body string `json:"body"`
	Seed uint64 `json:"seed"`
	// want and style stay here until the canary has an id.
	want, style string
}

// Resolve records the node ids the setup script gave the plants (by index). Every plant must
// have one, and no two the same.
func (s *Set) Resolve(ids map[int]string) error {
	s.Want, s.Style = map[string]string{}, map[string]string{}
	for i, p := range s.Plants {
		id, ok := ids[i]
		if !ok || id == "" {
			return fmt.Errorf("canary %d in %s was not planted", i, p.File)
		}
		if _, dup := s.Want[id]; dup {
			return fmt.Errorf("two canaries were planted as %s", id)
		}
		s.Want[id], s.Style[id] = p.want, p.style
	}
	return nil
}

// New makes a set for the given official test files: for every style one canary that must
// fail, plus passing ones, spread over the files at random (every file gets at least one of
// each outcome when perFile is set: how the task's own check proves canaries run in every
// file). Names come from rnd (crypto/rand when nil).
func New(rnd io.Reader, files []string, perFile bool) (*Set, error) {
	if rnd == nil {
		rnd = rand.Reader
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("canaries need at least one official test file")
	}
	files = append([]string{}, files...)
	sort.Strings(files)
	g := &gen{rnd: rnd, s: &Set{}}
	type plan struct {
		file, style, want string
	}
	var plans []plan
	for _, st := range Styles {
		f, err := g.pick(files)
		if err != nil {
			return nil, err
		}
		plans = append(plans, plan{f, st, Fail})
		if f, err = g.pick(files); err != nil {
			return nil, err
		}
		plans = append(plans, plan{f, st, Pass})
	}
	if perFile {
		for _, f := range files {
			for i, want := range []string{Fail, Pass} {
				plans = append(plans, plan{f, Styles[(len(plans)+i)%len(Styles)], want})
			}
		}
	}
	for _, p := range plans {
		if err := g.add(p.file, p.style, p.want); err != nil {
			return nil, err
		}
	}
	return g.s, nil
}

type gen struct {
	rnd io.Reader
	s   *Set
}

func (g *gen) pick(files []string) (string, error) {
	n, err := rand.Int(g.rnd, big.NewInt(int64(len(files))))
	if err != nil {
		return "", err
	}
	return files[n.Int64()], nil
}

// word is a fresh lower-case identifier part from the random source.
func (g *gen) word() (string, error) {
	b := make([]byte, 6)
	if _, err := io.ReadFull(g.rnd, b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

func (g *gen) number() (int64, error) {
	n, err := rand.Int(g.rnd, big.NewInt(900))
	if err != nil {
		return 0, err
	}
	return n.Int64() + 100, nil
}

// add plans one canary of style in file.
func (g *gen) add(file, style, want string) error {
	a, err := g.number()
	if err != nil {
		return err
	}
	b, err := g.number()
	if err != nil {
		return err
	}
	mod, err := g.word()
	if err != nil {
		return err
	}
	var seed [8]byte
	if _, err := io.ReadFull(g.rnd, seed[:]); err != nil {
		return err
	}
	// expect is what the canary compares a+b against: right for Pass, off by b for Fail.
	expect := a + b
	if want == Fail {
		expect = a + 2*b
	}
	const name = "__CANARY_NAME__"
	kind := "function"
	var body string
	m := "_m" + mod // module alias, fresh per canary so no official name is shadowed
	switch style {
	case "assert":
		body = fmt.Sprintf("def %s():\n    assert %d + %d == %d\n", name, a, b, expect)
	case "numpy.testing":
		body = fmt.Sprintf(`def %[1]s():
    try:
        import numpy as %[5]s
    except ImportError:
        assert [%[2]d.0 + %[3]d.0] == [%[4]d.0]
        return
    %[5]s.testing.assert_allclose(%[5]s.array([%[2]d.0]) + %[3]d.0, %[5]s.array([%[4]d.0]))
`, name, a, b, expect, m)
	case "numpy.allclose":
		body = fmt.Sprintf(`def %[1]s():
    try:
        import numpy as %[5]s
    except ImportError:
        assert %[2]d + %[3]d == %[4]d
        return
    assert %[5]s.allclose(%[5]s.array([%[2]d.0, 1.0]) + %[3]d.0, %[5]s.array([%[4]d.0, 1.0 + %[3]d.0]))
`, name, a, b, expect, m)
	case "unittest":
		kind = "class"
		body = fmt.Sprintf(`import unittest as %[4]s


class __CANARY_CLASS__(%[4]s.TestCase):
    def __CANARY_METHOD__(self):
        self.assertEqual(%[1]d + %[2]d, %[3]d)
`, a, b, expect, m)
	case "pytest.raises":
		exc := "ZeroDivisionError"
		if want == Fail {
			exc = "KeyError"
		}
		body = fmt.Sprintf(`def %[1]s():
    import pytest as %[4]s

    with %[4]s.raises(%[2]s):
        %[3]d // (%[3]d - %[3]d)
`, name, exc, a, m)
	case "torch.testing":
		body = fmt.Sprintf(`def %[1]s():
    try:
        import torch as %[5]s
    except ImportError:
        assert %[2]d + %[3]d == %[4]d
        return
    %[5]s.testing.assert_close(%[5]s.tensor([%[2]d.0]) + %[3]d.0, %[5]s.tensor([%[4]d.0]))
`, name, a, b, expect, m)
	default:
		return fmt.Errorf("unknown canary style %q", style)
	}
	g.s.Plants = append(g.s.Plants, Plant{File: file, Kind: kind, Body: body, Seed: binary.BigEndian.Uint64(seed[:]), want: want, style: style})
	return nil
}

// Planter is plant.py: the setup script's side of planting canaries (names drawn from the
// file's own test names, places among its tests), staged beside it as PlanterModule.
//
//go:embed plant.py
var Planter []byte

// PlanterModule is the planter's module name in the setup phase's inputs.
const PlanterModule = "infradev_canaries"
