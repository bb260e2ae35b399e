package patchread_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/infradev/infradev/harness/patchread"
)

func TestIsTest(t *testing.T) {
	for _, tt := range []struct {
		path string
		want bool
	}{
		{"tests/unit_tests/test_optimizer.py", true},
		{"tests/helpers.py", true},
		{"vllm/test/utils.py", true},
		{"megatron/core/test_utils.py", true},
		{"verl/trainer/ppo_test.py", true},
		{"conftest.py", true},
		{"harness/grade/grade_test.go", true},
		{"megatron/core/optimizer.py", false},
		{"megatron/core/testing.py", false},
		{"vllm/attestation/test.txt", false},
		{"latest/contest.py", false},
		{"tests.py", false},
	} {
		if got := patchread.IsTest(tt.path); got != tt.want {
			t.Errorf("IsTest(%q) = %v, want %v", tt.path, got, tt.want)
		}
	}
}

func TestChecks(t *testing.T) {
	for _, tt := range []struct {
		name  string
		lines []string
		want  []string
	}{
		{"peak memory", []string{"peak = torch.cuda.max_memory_allocated()"}, []string{"memory"}},
		{"reset stats", []string{"torch.cuda.reset_peak_memory_stats()"}, []string{"memory"}},
		{"tracemalloc", []string{"tracemalloc.start()"}, []string{"memory"}},
		{"rss", []string{"rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss"}, []string{"memory"}},
		{"psutil", []string{"used = psutil.Process().memory_info().rss"}, []string{"memory"}},
		{"peak name", []string{"assert peak_mem_gb < 10"}, []string{"memory"}},
		{"nvidia-smi", []string{`out = subprocess.check_output(["nvidia-smi", "--query-gpu=memory.used"])`}, []string{"memory"}},
		{"perf_counter", []string{"start = time.perf_counter()"}, []string{"time"}},
		{"time.time", []string{"t0 = time.time()"}, []string{"time"}},
		{"cuda events", []string{"start = torch.cuda.Event(enable_timing=True)"}, []string{"time"}},
		{"elapsed", []string{"ms = start.elapsed_time(end)"}, []string{"time"}},
		{"benchmark fixture", []string{"result = benchmark(run_step, model)"}, []string{"time"}},
		{"latency name", []string{"assert avg_latency_ms < baseline"}, []string{"time"}},
		{"patched collective", []string{`with mock.patch.object(dist, "all_reduce") as m:`}, []string{"traffic"}},
		{"monkeypatched", []string{`monkeypatch.setattr(torch.distributed, "all_gather_into_tensor", fake)`}, []string{"traffic"}},
		{"counter in name", []string{"assert num_all_reduce_calls == 1"}, []string{"traffic"}},
		{"tally", []string{`assert counts["reduce_scatter_tensor"] == 2`}, []string{"traffic"}},
		{"traffic name", []string{"assert comm_bytes <= expected"}, []string{"traffic"}},
		{"profiler nccl", []string{`nccl = [e for e in prof.key_averages() if "nccl" in e.key]`}, []string{"traffic"}},
		{"plain collective", []string{"dist.all_reduce(t)"}, nil},
		{"collective of a count", []string{"dist.all_reduce(count, op=dist.ReduceOp.SUM)"}, nil},
		{"shape broadcast", []string{"x = torch.broadcast_to(y, shape)", "n = x.numel()"}, nil},
		{"moe dispatch", []string{"out = all_to_all(dispatch_input, group)"}, nil},
		{"nccl backend", []string{`dist.init_process_group(backend="nccl")`}, nil},
		{"comment", []string{"x = 1  # peak memory via max_memory_allocated, latency too"}, nil},
		{"hash in string", []string{`name = "#" ; t = time.monotonic()`}, []string{"time"}},
		{"docstring", []string{`"""Check the latency of the all_reduce call count.`, "max_memory_allocated", `"""`, "x = 1"}, nil},
		{"one-line docstring", []string{`    """Measures throughput."""`}, nil},
		{"after docstring", []string{`"""Doc.`, `"""`, "torch.cuda.memory_reserved()"}, []string{"memory"}},
		{"all three", []string{"t = time.perf_counter()", "m.call_count  # all_reduce", "spy = mocker.spy(dist, 'broadcast')", "torch.cuda.memory_stats()"}, []string{"memory", "time", "traffic"}},
	} {
		got, _ := patchread.Checks(tt.lines)
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%s: Checks(%q) = %v, want %v", tt.name, tt.lines, got, tt.want)
		}
	}
}

func TestChecksEvidence(t *testing.T) {
	long := "    peak = torch.cuda.max_memory_allocated(" + strings.Repeat("é", 80) + ")"
	_, got := patchread.Checks([]string{"x = 1", long, "torch.cuda.memory_allocated()", "\tt0 = time.perf_counter()"})
	want := map[string]string{
		"memory": "peak = torch.cuda.max_memory_allocated(" + strings.Repeat("é", 40),
		"time":   "t0 = time.perf_counter()",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Checks evidence mismatch (-want +got):\n%s", diff)
	}
}

// submission adds three test files, changes one, renames one, deletes one, adds a binary file
// under tests/ and changes library code.
const submission = `diff --git a/megatron/core/distributed/grad_buffer.py b/megatron/core/distributed/grad_buffer.py
index 3f1c2a0..8b7d9e1 100644
--- a/megatron/core/distributed/grad_buffer.py
+++ b/megatron/core/distributed/grad_buffer.py
@@ -1,3 +1,4 @@
 import torch
+import tests.helpers
 
 class GradBuffer:
diff --git a/tests/unit_tests/test_existing.py b/tests/unit_tests/test_existing.py
index 1111111..2222222 100644
--- a/tests/unit_tests/test_existing.py
+++ b/tests/unit_tests/test_existing.py
@@ -10,4 +10,5 @@ def test_buffer():
     buf = GradBuffer(16)
-    buf.reset()
+    buf.reset(full=True)
+    start = time.perf_counter()
     assert buf.numel == 16
     return buf
@@ -30,2 +31,3 @@ def test_other():
     pass
+    assert True
 
diff --git a/tests/unit_tests/test_gone.py b/tests/unit_tests/test_gone.py
deleted file mode 100644
index 3333333..0000000
--- a/tests/unit_tests/test_gone.py
+++ /dev/null
@@ -1,2 +0,0 @@
-def test_gone():
-    torch.cuda.max_memory_allocated()
diff --git a/tests/unit_tests/test_memory.py b/tests/unit_tests/test_memory.py
new file mode 100644
index 0000000..4444444
--- /dev/null
+++ b/tests/unit_tests/test_memory.py
@@ -0,0 +1,8 @@
+import torch
+
+def test_peak_memory():
+    """Peak memory must stay under the old bound."""
+    torch.cuda.reset_peak_memory_stats()
+    run()
+    peak = torch.cuda.max_memory_allocated()
+    assert peak < 2 * 1024**3
diff --git a/tests/unit_tests/test_plain.py b/tests/unit_tests/test_plain.py
new file mode 100644
index 0000000..5555555
--- /dev/null
+++ b/tests/unit_tests/test_plain.py
@@ -0,0 +1,5 @@
+import torch.distributed as dist
+
+def test_sum():
+    dist.all_reduce(t)
+    assert t.sum() == world_size
diff --git a/tests/unit_tests/test_traffic.py b/tests/unit_tests/test_traffic.py
new file mode 100644
index 0000000..6666666
--- /dev/null
+++ b/tests/unit_tests/test_traffic.py
@@ -0,0 +1,7 @@
+from unittest import mock
+import torch.distributed as dist
+
+def test_one_all_reduce_per_bucket():
+    with mock.patch.object(dist, "all_reduce") as m:
+        buf.start_grad_sync()
+    assert m.call_count == 2
diff --git a/tests/unit_tests/test_old_name.py b/tests/unit_tests/test_new_name.py
similarity index 90%
rename from tests/unit_tests/test_old_name.py
rename to tests/unit_tests/test_new_name.py
index 7777777..8888888 100644
--- a/tests/unit_tests/test_old_name.py
+++ b/tests/unit_tests/test_new_name.py
@@ -1,2 +1,2 @@
-def test_old():
+def test_new():
     pass
diff --git a/tests/data/w.bin b/tests/data/w.bin
new file mode 100644
index 0000000000000000000000000000000000000000..6164d9f90821c3bf1dd2b0ccc10d92277d28ddfb
GIT binary patch
literal 6
NcmZQzWMcmR4*&xg0t5g6

literal 0
HcmV?d00001

`

func TestTests(t *testing.T) {
	got, err := patchread.Tests([]byte(submission))
	if err != nil {
		t.Fatalf("Tests(submission) error: %v", err)
	}
	want := []patchread.AddedTest{
		{
			Path: "tests/unit_tests/test_existing.py", Lines: 3,
			Checks: []string{"time"}, Evidence: map[string]string{"time": "start = time.perf_counter()"},
		},
		{
			Path: "tests/unit_tests/test_memory.py", New: true, Lines: 8,
			Checks: []string{"memory"}, Evidence: map[string]string{"memory": "torch.cuda.reset_peak_memory_stats()"},
		},
		{Path: "tests/unit_tests/test_new_name.py", Lines: 1},
		{Path: "tests/unit_tests/test_plain.py", New: true, Lines: 5},
		{
			Path: "tests/unit_tests/test_traffic.py", New: true, Lines: 7,
			Checks: []string{"traffic"}, Evidence: map[string]string{"traffic": `with mock.patch.object(dist, "all_reduce") as m:`},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Tests(submission) mismatch (-want +got):\n%s", diff)
	}
}

func TestTestsEmpty(t *testing.T) {
	for _, patch := range []string{"", "\n\n"} {
		got, err := patchread.Tests([]byte(patch))
		if err != nil || got != nil {
			t.Errorf("Tests(%q) = %v, %v, want nil, nil", patch, got, err)
		}
	}
}

func TestTestsInvalid(t *testing.T) {
	for _, patch := range []string{invalid, "this is not a diff\n"} {
		if got, err := patchread.Tests([]byte(patch)); err == nil {
			t.Errorf("Tests(%q) = %v, nil, want an error", patch, got)
		}
	}
}

// invalid claims three added lines in a hunk that has two.
const invalid = `diff --git a/tests/test_x.py b/tests/test_x.py
new file mode 100644
index 0000000..1111111
--- /dev/null
+++ b/tests/test_x.py
@@ -0,0 +1,3 @@
+def test_x():
+    pass
diff --git a/x.py b/x.py
`

// gold changes one file in three hunks.
const gold = `diff --git a/megatron/core/distributed/grad_buffer.py b/megatron/core/distributed/grad_buffer.py
index 3f1c2a0..8b7d9e1 100644
--- a/megatron/core/distributed/grad_buffer.py
+++ b/megatron/core/distributed/grad_buffer.py
@@ -10,3 +10,8 @@ class GradBuffer:
     def __init__(self, numel, dtype):
         self.numel = numel
         self.dtype = dtype
+        self.bucket_size = 40000000
+        self.buckets = []
+        self.grad_data = torch.zeros(numel, dtype=dtype, device="cuda")
+        self.overlap_grad_reduce = True  # overlap the reduce with backward
+        self.is_last_microbatch = True
@@ -40,3 +45,12 @@ class GradBuffer:
     def reset(self):
         self.grad_data.zero_()
 
+    def start_grad_sync(self):
+        for bucket in self.buckets:
+            handle = torch.distributed.all_reduce(
+                bucket.grad_data, group=self.data_parallel_group, async_op=self.overlap_grad_reduce
+            )
+            bucket.communication_handle = handle
+        if not self.overlap_grad_reduce:
+            self.finish_grad_sync()
+
@@ -60,2 +74,9 @@ class GradBuffer:
     def finish_grad_sync(self):
+        for bucket in self.buckets:
+            if bucket.communication_handle is not None:
+                bucket.communication_handle.wait()
+                bucket.communication_handle = None
+        scale = 1.0 / self.data_parallel_world_size
+        for bucket in self.buckets:
+            bucket.grad_data.mul_(scale)
         return
`

// rewritten is gold with its variables renamed and its last two hunks swapped.
const rewritten = `diff --git a/megatron/core/distributed/grad_buffer.py b/megatron/core/distributed/grad_buffer.py
index 3f1c2a0..9c0ffee 100644
--- a/megatron/core/distributed/grad_buffer.py
+++ b/megatron/core/distributed/grad_buffer.py
@@ -10,3 +10,8 @@ class GradBuffer:
     def __init__(self, numel, dtype):
         self.numel = numel
         self.dtype = dtype
+        self.max_bucket_numel = 40000000
+        self.groups = []
+        self.main_grads = torch.zeros(numel, dtype=dtype, device="cuda")
+        self.async_reduce = True
+        self.last_micro = True
@@ -40,2 +45,10 @@ class GradBuffer:
     def reset(self):
+    def wait_for_reduce(self):
+        for g in self.groups:
+            if g.work is not None:
+                g.work.wait()
+                g.work = None
+        factor = 1.0 / self.data_parallel_world_size
+        for g in self.groups:
+            g.main_grads.mul_(factor)
         self.grad_data.zero_()
@@ -60,2 +72,11 @@ class GradBuffer:
     def finish_grad_sync(self):
+    def launch_reduce(self):
+        for g in self.groups:
+            w = torch.distributed.all_reduce(
+                g.main_grads, group=self.data_parallel_group, async_op=self.async_reduce
+            )
+            g.work = w
+        if not self.async_reduce:
+            self.wait_for_reduce()
+
         return
`

// unrelated changes other code in another project.
const unrelated = `diff --git a/vllm/sampling_params.py b/vllm/sampling_params.py
index 0a0a0a0..1b1b1b1 100644
--- a/vllm/sampling_params.py
+++ b/vllm/sampling_params.py
@@ -5,2 +5,9 @@
 @dataclass
 class SamplingParams:
+    temperature: float = 1.0
+    top_p: float = 1.0
+    top_k: int = -1
+    stop: Optional[List[str]] = None
+
+    def __post_init__(self) -> None:
+        if not 0.0 < self.top_p <= 1.0: raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
`

// extraTest is a test file added beside gold's change.
const extraTest = `diff --git a/tests/unit_tests/test_grad_buffer.py b/tests/unit_tests/test_grad_buffer.py
new file mode 100644
index 0000000..abcdef0
--- /dev/null
+++ b/tests/unit_tests/test_grad_buffer.py
@@ -0,0 +1,3 @@
+def test_sync():
+    buf = GradBuffer(16, torch.float32)
+    buf.start_grad_sync()
`

// binary adds a binary file with its data.
const binary = `diff --git a/logo.png b/logo.png
new file mode 100644
index 0000000000000000000000000000000000000000..41e3e497080ccf1095445034643223fe93286302
GIT binary patch
literal 6
NcmeAS@N;Ki000Kr0dD{R

literal 0
HcmV?d00001

`

func TestSimilarity(t *testing.T) {
	// goldNoComment differs from gold only in a comment, which must not count.
	goldNoComment := strings.Replace(gold, "  # overlap the reduce with backward", "", 1)
	for _, tt := range []struct {
		name     string
		a, b     string
		min, max float64
	}{
		{"identical", gold, gold, 1, 1},
		{"comment stripped", gold, goldNoComment, 1, 1},
		{"renamed and reordered", gold, rewritten, 0.5, 0.85},
		{"unrelated", gold, unrelated, 0, 0.3},
		{"with an added test", gold, gold + extraTest, 1, 1},
		{"with a binary file", gold + binary, gold, 1, 1},
		{"only a test", extraTest, extraTest, 0, 0},
		{"both empty", "", "", 0, 0},
		{"one empty", gold, "", 0, 0},
	} {
		got, err := patchread.Similarity([]byte(tt.a), []byte(tt.b))
		if err != nil {
			t.Errorf("%s: Similarity error: %v", tt.name, err)
			continue
		}
		if got < tt.min || got > tt.max {
			t.Errorf("%s: Similarity = %.3f, want in [%.2f, %.2f]", tt.name, got, tt.min, tt.max)
		}
		if back, _ := patchread.Similarity([]byte(tt.b), []byte(tt.a)); back != got {
			t.Errorf("%s: Similarity(b, a) = %.3f, want %.3f as Similarity(a, b)", tt.name, back, got)
		}
	}
}

func TestSimilarityInvalid(t *testing.T) {
	for _, tt := range [][2]string{{invalid, gold}, {gold, invalid}, {gold, "not a diff"}} {
		if got, err := patchread.Similarity([]byte(tt[0]), []byte(tt[1])); err == nil {
			t.Errorf("Similarity(%.20q, %.20q) = %v, nil, want an error", tt[0], tt[1], got)
		}
	}
}

// TestSimilarityLarge crosses the LCS limit, where 4-grams are compared instead.
func TestSimilarityLarge(t *testing.T) {
	big := func(n int, rename string) string {
		var b strings.Builder
		fmt.Fprintf(&b, "diff --git a/big.py b/big.py\nnew file mode 100644\nindex 0000000..1111111\n--- /dev/null\n+++ b/big.py\n@@ -0,0 +1,%d @@\n", n)
		for i := range n {
			name := "value"
			if i%2 == 0 {
				name = rename
			}
			fmt.Fprintf(&b, "+%s_%d = compute(%d, scale=2) + offset\n", name, i, i)
		}
		return b.String()
	}
	a := big(2000, "value") // 12 tokens a line: past the 20000-token limit
	for _, tt := range []struct {
		name     string
		b        string
		min, max float64
	}{
		{"identical", a, 1, 1},
		{"half renamed", big(2000, "other"), 0.75, 0.9},
		{"unrelated", unrelated, 0, 0.01},
	} {
		got, err := patchread.Similarity([]byte(a), []byte(tt.b))
		if err != nil {
			t.Fatalf("%s: Similarity error: %v", tt.name, err)
		}
		if got < tt.min || got > tt.max {
			t.Errorf("%s: Similarity = %.3f, want in [%.2f, %.2f]", tt.name, got, tt.min, tt.max)
		}
	}
}
