package patchread

import (
	"regexp"
	"sort"
	"strings"
	"unicode/utf8"
)

// The vocabulary of measures, matched on one line of code at a time (comments and docstrings
// stripped):
//
//   - memory: torch.cuda (max_)memory_allocated/reserved/cached, reset_peak_memory_stats,
//     memory_stats, mem_get_info; tracemalloc; resource.getrusage / ru_maxrss; psutil memory and
//     memory_info; names with peak_mem/peak_memory; nvidia-smi or NVML memory queries.
//   - time: time.perf_counter, time.time(), time.monotonic, timeit, CUDA events
//     (enable_timing, elapsed_time), the pytest-benchmark `benchmark(` fixture, and names with
//     latency or throughput.
//   - traffic: a torch.distributed collective (all_reduce, all_gather, reduce_scatter,
//     broadcast, all_to_all, isend/irecv/send/recv, barrier, and their variants) on a line that
//     mocks or counts it; names such as comm_bytes, bytes_sent, traffic or num_collectives; and
//     nccl or c10d on a line that reads profiler records (key_averages, events, .key, .name).
//
// A test's own name (test_peak_memory) says what it means to check, not that it measures
// anything, so test names are dropped before matching.
//
// A test that merely calls a collective to compute its result is not measuring traffic, so a
// collective alone is never enough. Mocking words (mock, patch, spy, calls, call_count,
// call_args, assert_called, wraps) count anywhere on the line; counting words (count, counter,
// num, n, bytes, nbytes, numel, volume) only inside the same name as the collective
// (all_reduce_calls, num_all_gather) or as a tally keyed by it (counts["all_reduce"]), since
// `dist.all_reduce(count)` is a computation, not a measurement.
// Measures are what Checks can find, in order.
var Measures = []string{"memory", "time", "traffic"}

var measures = []struct {
	name string
	re   *regexp.Regexp
	fn   func(code string) bool
}{
	{name: "memory", re: regexp.MustCompile(`memory_(allocated|reserved|cached)\b|` +
		`\b(reset_peak_memory_stats|memory_stats|mem_get_info|tracemalloc|getrusage|ru_maxrss|memory_(full_)?info)\b|` +
		`\bpsutil\b.*memory|(?i:(^|[^a-z0-9])peak_?mem|nvidia-smi.*memory|memory.*nvidia-smi|` +
		`nvmlDeviceGetMemoryInfo|query-gpu=memory)`)},
	{name: "time", re: regexp.MustCompile(`\b(perf_counter(_ns)?|monotonic(_ns)?|timeit|enable_timing|elapsed_time)\b|` +
		`\btime\.time(_ns)?\(\)|\bbenchmark(\.pedantic)?\(|(?i:(^|[^a-z0-9])(latency|latencies|throughput)([^a-z0-9]|$))`)},
	{name: "traffic", fn: traffic},
}

var (
	ident    = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`)
	testName = regexp.MustCompile(`\b(test_|Test)\w*`)
	// tally is a counter subscripted by a string key: counts["all_reduce"], calls['all_gather'].
	tally = regexp.MustCompile(`(?i)[a-z0-9_]*(count|calls|bytes)[a-z0-9_]*\s*\[\s*["']([A-Za-z0-9_.]+)`)
	// collective names a torch.distributed collective as "_"-separated words of a name, so
	// _all_gather_base and num_all_reduce_calls both name one; shape is broadcast_to and kin.
	collective = regexp.MustCompile(`(^|_)(all_reduce|all_gather|reduce_scatter|broadcast|all_to_all|` +
		`isend|irecv|send|recv|barrier|allreduce|allgather|reducescatter|alltoall)(_|$)`)
	shape    = regexp.MustCompile(`(^|_)broadcast_(to|tensors|shapes)(_|$)`)
	counting = map[string]bool{"count": true, "counts": true, "counter": true, "counters": true,
		"counting": true, "counted": true, "calls": true, "called": true, "num": true, "n": true,
		"bytes": true, "nbytes": true, "numel": true, "volume": true, "mock": true, "mocked": true,
		"patched": true, "spy": true}
	mocking      = []string{"mock", "monkeypatch", "call_count", "call_args", "assert_called", "assert_any_call"}
	mockingWord  = map[string]bool{"patch": true, "patched": true, "spy": true, "spies": true, "wraps": true, "calls": true}
	trafficNames = []string{"comm_bytes", "bytes_sent", "bytes_recv", "bytes_received", "traffic",
		"num_collectives", "collective_count", "comm_volume", "comm_count"}
	profilerWord = map[string]bool{"key_averages": true, "events": true, "function_events": true,
		"profiler": true, "profile": true, "prof": true, "key": true, "name": true}
)

func traffic(code string) bool {
	var coll, mocked, nccl, profiler bool
	for _, id := range ident.FindAllString(code, -1) {
		low := strings.ToLower(id)
		words := strings.Split(low, "_")
		if isCollective(low) {
			coll = true
			for _, w := range words {
				if counting[w] {
					return true
				}
			}
		}
		for _, s := range trafficNames {
			if strings.Contains(low, s) {
				return true
			}
		}
		for _, s := range mocking {
			mocked = mocked || strings.Contains(low, s)
		}
		for _, w := range words {
			mocked = mocked || mockingWord[w]
		}
		nccl = nccl || strings.Contains(low, "nccl") || strings.Contains(low, "c10d")
		profiler = profiler || profilerWord[low]
	}
	if coll && mocked || nccl && profiler {
		return true
	}
	for _, m := range tally.FindAllStringSubmatch(code, -1) {
		for _, id := range ident.FindAllString(m[2], -1) {
			if isCollective(id) {
				return true
			}
		}
	}
	return false
}

func isCollective(name string) bool {
	name = strings.ToLower(name)
	return collective.MatchString(name) && !shape.MatchString(name)
}

// reader accumulates checks over runs of source lines, keeping the first evidence of each.
type reader struct{ evidence map[string]string }

// read classifies the lines marked added (all of them when added is nil). The docstring state
// starts closed at the first line, so a run should start where the source does or at a hunk.
func (r *reader) read(lines []string, added []bool) {
	var doc string // the delimiter of the docstring we are in, if any
	for i, line := range lines {
		code := ""
		if doc == "" {
			code = stripComment(line)
			for _, d := range []string{`"""`, `'''`} {
				k := strings.Index(code, d)
				switch {
				case k < 0:
				case strings.Count(code, d)%2 == 1:
					doc, code = d, code[:k]
				case strings.HasPrefix(strings.TrimSpace(code), d):
					code = ""
				}
			}
		} else if strings.Contains(line, doc) {
			doc = ""
		}
		if added != nil && !added[i] || strings.TrimSpace(code) == "" {
			continue
		}
		code = testName.ReplaceAllString(code, "")
		for _, m := range measures {
			if _, seen := r.evidence[m.name]; seen {
				continue
			}
			if m.re != nil && m.re.MatchString(code) || m.fn != nil && m.fn(code) {
				if r.evidence == nil {
					r.evidence = map[string]string{}
				}
				r.evidence[m.name] = clip(strings.TrimSpace(line), 120)
			}
		}
	}
}

func (r *reader) result() ([]string, map[string]string) {
	var checks []string
	for name := range r.evidence {
		checks = append(checks, name)
	}
	sort.Strings(checks)
	return checks, r.evidence
}

// clip cuts s to at most n bytes without splitting a character.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
