package cli_test

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/infradev/infradev/harness/agent"
	"github.com/infradev/infradev/harness/report"
	"github.com/infradev/infradev/harness/result"
)

// scriptedAgent copies testdata/agents/<name> into dir and adds files (relative to its files/).
func scriptedAgent(t *testing.T, dir, name string, files map[string][]byte, edit func(string) string) string {
	t.Helper()
	src := filepath.Join("testdata", "agents", name)
	dst := filepath.Join(dir, name)
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	for rel, data := range files {
		p := filepath.Join(dst, "files", rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if edit != nil {
		y := filepath.Join(dst, "agent.yaml")
		data, err := os.ReadFile(y)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(y, []byte(edit(string(data))), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

type sampleSpec struct {
	Samples []struct {
		Name, Patch, Want string
	}
}

// TestScriptedAgentsGetTheVerdictsTheyWereBuiltFor runs scripted command agents over demo
// tasks, in real sandboxes, and checks each attempt's record and verdict: one applies gold
// (every demo task: resolved), one a sample the probes reject, one changes nothing, one runs
// past its budget after starting a change, one rewrites its .git to make the diff lie, and one searches the sandbox for the hidden files
// and for the network (finding neither; given network: host, it does reach the network).
func TestScriptedAgentsGetTheVerdictsTheyWereBuiltFor(t *testing.T) {
	requireSandbox(t)
	root := repoRoot(t)
	agents, out := t.TempDir(), t.TempDir()
	demo, err := filepath.Glob(filepath.Join(root, "tasks", "demo", "*", "task.yaml"))
	if err != nil || len(demo) != 12 {
		t.Fatalf("demo tasks: %v, %v", demo, err)
	}
	gold, samples := map[string][]byte{}, map[string][]byte{}
	wantSample := map[string]string{}
	for _, f := range demo {
		id := filepath.Base(filepath.Dir(f))
		data, err := os.ReadFile(filepath.Join(filepath.Dir(f), "gold.patch"))
		if err != nil {
			t.Fatal(err)
		}
		gold["patches/"+id+".patch"] = data
		var ss sampleSpec
		pdir := filepath.Join(root, "probes", "demo", id)
		raw, err := os.ReadFile(filepath.Join(pdir, "samples.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(raw, &ss); err != nil {
			t.Fatal(err)
		}
		for _, s := range ss.Samples {
			if s.Want == result.ProbesFailed {
				if samples["patches/"+id+".patch"], err = os.ReadFile(filepath.Join(pdir, s.Patch)); err != nil {
					t.Fatal(err)
				}
				wantSample[id] = s.Name
				break
			}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := map[string][]byte{"port": []byte(fmt.Sprint(ln.Addr().(*net.TCPAddr).Port))}
	withNet := func(s string) string {
		return strings.Replace(strings.Replace(s, "name: probe-reader", "name: probe-reader-net", 1), "budget:", "network: host\nbudget:", 1)
	}
	few := []string{"minitron-0001", "pagedinfer-0001", "minirl-0001"}
	runs := []struct {
		dir   string
		tasks []string
	}{
		{scriptedAgent(t, agents, "gold", gold, nil), []string{filepath.Join(root, "tasks", "demo", "*")}},
		{scriptedAgent(t, agents, "sample", samples, nil), few},
		{scriptedAgent(t, agents, "nothing", nil, nil), few[:1]},
		{scriptedAgent(t, agents, "hostile-git", gold, nil), few[:1]},
		{scriptedAgent(t, agents, "over-budget", nil, nil), few[:1]},
		{scriptedAgent(t, agents, "probe-reader", port, nil), few[:1]},
	}
	netAgent := scriptedAgent(t, t.TempDir(), "probe-reader", port, withNet)
	netDir := filepath.Join(filepath.Dir(netAgent), "probe-reader-net")
	if err := os.Rename(netAgent, netDir); err != nil {
		t.Fatal(err)
	}
	runs = append(runs, struct {
		dir   string
		tasks []string
	}{netDir, few[:1]})
	for _, r := range runs {
		args := append(storeFlags(t), "agent", "run", "--agent", r.dir, "--run-id", "scripted", "--out", out, "--results", "",
			"--tasks-root", filepath.Join(root, "tasks"), "--probes", filepath.Join(root, "probes"),
			"--environments", filepath.Join(root, "environments"))
		for _, task := range r.tasks {
			args = append(args, "--tasks", task)
		}
		if code, stdout, stderr := infradev(t, args...); code != 0 {
			t.Fatalf("agent run %s: exit %d\n%s\n%s", filepath.Base(r.dir), code, stdout, stderr)
		}
	}

	// The same command again resumes: every attempt and every grade is found finished.
	nothingRecord := filepath.Join(out, "scripted", "agent", "nothing@instruction@1", few[0], "agent.json")
	before, err := os.ReadFile(nothingRecord)
	if err != nil {
		t.Fatal(err)
	}
	args := append(storeFlags(t), "agent", "run", "--agent", runs[2].dir, "--run-id", "scripted", "--out", out, "--results", "",
		"--tasks-root", filepath.Join(root, "tasks"), "--probes", filepath.Join(root, "probes"),
		"--environments", filepath.Join(root, "environments"), "--tasks", few[0])
	code, _, stderr := infradev(t, args...)
	after, _ := os.ReadFile(nothingRecord)
	if code != 0 || !strings.Contains(stderr, "(resumed)") || strings.Contains(stderr, "(ran)") || string(before) != string(after) {
		t.Errorf("rerun: exit %d, record changed %v, stderr:\n%s\nwant every attempt and grade resumed", code, string(before) != string(after), stderr)
	}

	runDir := filepath.Join(out, "scripted")
	stored, err := report.LoadRun(runDir)
	if err != nil {
		t.Fatal(err)
	}
	results := map[string]*result.Result{}
	for _, s := range stored {
		r := s.Result
		if r.PromptVariant != agent.Instruction || r.Attempt != 1 {
			t.Errorf("%s %s: variant %q attempt %d, want instruction 1", r.Model, r.InstanceID, r.PromptVariant, r.Attempt)
		}
		results[r.Model+" "+r.InstanceID] = r
	}
	record := func(model, id string) (*agent.Record, string) {
		dir := filepath.Join(runDir, "agent", model+"@instruction@1", id)
		data, err := os.ReadFile(filepath.Join(dir, "agent.json"))
		if err != nil {
			t.Fatal(err)
		}
		var rec agent.Record
		if err := json.Unmarshal(data, &rec); err != nil {
			t.Fatal(err)
		}
		patch, err := os.ReadFile(filepath.Join(dir, "patch.diff"))
		if err != nil {
			t.Fatal(err)
		}
		return &rec, string(patch)
	}
	verdict := func(model, id, class string) *result.Result {
		t.Helper()
		r := results[model+" "+id]
		if r == nil {
			t.Fatalf("no result for %s %s", model, id)
		}
		if r.FailureClass != class || r.Resolved != (class == "") {
			t.Errorf("%s %s: resolved %v class %q (%s), want class %q", model, id, r.Resolved, r.FailureClass, r.Reason, class)
		}
		return r
	}
	for _, f := range demo {
		id := filepath.Base(filepath.Dir(f))
		verdict("gold", id, "")
		rec, _ := record("gold", id)
		if rec.Outcome.Status != agent.Completed || rec.PatchBytes == 0 {
			t.Errorf("gold %s: %+v", id, rec)
		}
		if _, err := os.Stat(filepath.Join(runDir, "agent", "gold@instruction@1", id, "logs", "result.json")); err != nil {
			t.Errorf("gold %s: the agent's own log was not kept: %v", id, err)
		}
	}
	for _, id := range few {
		if r := verdict("sample", id, result.ProbesFailed); len(r.FailedProbeCategories) == 0 {
			t.Errorf("sample %s (%s): no failed probe category", id, wantSample[id])
		}
	}
	if r := verdict("nothing", few[0], result.OfficialTestsFailed); !r.EmptyPatch {
		t.Errorf("nothing: empty_patch not set")
	}
	verdict("over-budget", few[0], result.OfficialTestsFailed)
	if rec, patch := record("over-budget", few[0]); rec.Outcome.Status != agent.BudgetExceeded || !strings.Contains(patch, "+started, not finished") {
		t.Errorf("over-budget: status %q, patch:\n%s\nwant budget_exceeded and the note it wrote", rec.Outcome.Status, patch)
	}
	// What the agent did to .git changes nothing: the fix it committed is in the diff against
	// the base commit, the file it hid is there, nothing went through its filter, paths keep
	// their prefixes.
	verdict("hostile-git", few[0], "")
	if _, patch := record("hostile-git", few[0]); !strings.Contains(patch, "+kept out of git's sight\n") || strings.Contains(patch, "FILTERED") || !strings.Contains(patch, "--- a/") {
		t.Errorf("hostile-git's submission was read through its .git:\n%s", patch)
	}
	verdict("probe-reader", few[0], result.OfficialTestsFailed)
	_, patch := record("probe-reader", few[0])
	for _, want := range []string{"+hidden files: none", "+run: agent-logs", "+run: prompt", "+network: unreachable"} {
		if !strings.Contains(patch, want+"\n") {
			t.Errorf("probe-reader's FOUND.txt lacks %q:\n%s", want, patch)
		}
	}
	if strings.Contains(patch, "run: probes") || strings.Contains(patch, "run: in\n") {
		t.Errorf("the agent's sandbox holds harness inputs:\n%s", patch)
	}
	if _, patch := record("probe-reader-net", few[0]); !strings.Contains(patch, "+network: reached\n") {
		t.Errorf("with network: host the same agent should reach the host; FOUND.txt:\n%s", patch)
	}
}
