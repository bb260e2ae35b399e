package stats_test

import (
	"encoding/json"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/infradev/infradev/harness/stats"
)

const tol = 1e-9

func near(x, y, eps float64) bool { return math.Abs(x-y) <= eps }

func contains(iv stats.Interval, x float64) bool { return iv.Lo <= x && x <= iv.Hi }

func TestPassAtK(t *testing.T) {
	for _, tc := range []struct {
		n, c, k int
		want    float64
	}{
		{10, 3, 1, 0.3},
		{10, 3, 10, 1},
		{5, 0, 2, 0},
		{2, 1, 2, 1},
		{4, 1, 2, 0.5},
		{10, 3, 5, 1 - 21.0/252},
		{5, 5, 3, 1},
		{1, 1, 1, 1},
		{1, 0, 1, 0},
	} {
		if got := stats.PassAtK(tc.n, tc.c, tc.k); !near(got, tc.want, tol) {
			t.Errorf("PassAtK(%d, %d, %d) = %v, want %v", tc.n, tc.c, tc.k, got, tc.want)
		}
	}
	for _, tc := range []struct{ n, c, k int }{{3, 1, 4}, {0, 0, 1}, {0, 0, 0}, {5, 2, 0}} {
		if got := stats.PassAtK(tc.n, tc.c, tc.k); !math.IsNaN(got) {
			t.Errorf("PassAtK(%d, %d, %d) = %v, want NaN", tc.n, tc.c, tc.k, got)
		}
	}
}

// TestPassAtKBruteForce: the product form agrees with the definition, the share of k-subsets of
// the n attempts that contain at least one of the c passing ones.
func TestPassAtKBruteForce(t *testing.T) {
	for n := 1; n <= 8; n++ {
		for c := 0; c <= n; c++ {
			passMask := uint(1)<<c - 1 // attempts 0..c-1 passed
			for k := 1; k <= n; k++ {
				var subsets, hits int
				for s := uint(0); s < 1<<n; s++ {
					if bits.OnesCount(s) != k {
						continue
					}
					subsets++
					if s&passMask != 0 {
						hits++
					}
				}
				want := float64(hits) / float64(subsets)
				if got := stats.PassAtK(n, c, k); !near(got, want, 1e-12) {
					t.Errorf("PassAtK(%d, %d, %d) = %v, want %v", n, c, k, got, want)
				}
			}
		}
	}
}

// TestPassAtKLargeN: counts whose binomial coefficients overflow float64 still give a value.
func TestPassAtKLargeN(t *testing.T) {
	got := stats.PassAtK(2000, 1000, 1000)
	if math.IsNaN(got) || got < 0.999999 || got > 1 {
		t.Errorf("PassAtK(2000, 1000, 1000) = %v, want just under 1", got)
	}
	if got := stats.PassAtK(2000, 700, 1); !near(got, 0.35, 1e-12) {
		t.Errorf("PassAtK(2000, 700, 1) = %v, want 0.35", got)
	}
}

func TestWilson(t *testing.T) {
	for _, tc := range []struct {
		s, n int
		want stats.Interval
	}{
		{0, 10, stats.Interval{Lo: 0, Hi: 0.2775}},
		{5, 10, stats.Interval{Lo: 0.2366, Hi: 0.7634}},
		{10, 10, stats.Interval{Lo: 0.7225, Hi: 1}},
		{1, 10, stats.Interval{Lo: 0.0179, Hi: 0.4042}},
		{0, 0, stats.Interval{Lo: 0, Hi: 1}},
	} {
		got := stats.Wilson(tc.s, tc.n)
		if !near(got.Lo, tc.want.Lo, 1e-3) || !near(got.Hi, tc.want.Hi, 1e-3) {
			t.Errorf("Wilson(%d, %d) = %+v, want %+v", tc.s, tc.n, got, tc.want)
		}
	}
	for n := 1; n <= 50; n++ {
		for s := 0; s <= n; s++ {
			iv, p := stats.Wilson(s, n), float64(s)/float64(n)
			if !contains(iv, p) || iv.Lo < 0 || iv.Hi > 1 {
				t.Fatalf("Wilson(%d, %d) = %+v, want an interval in [0, 1] containing %v", s, n, iv, p)
			}
		}
	}
}

func TestPassAtKOver(t *testing.T) {
	tasks := []stats.Attempts{{N: 10, C: 3}, {N: 10, C: 0}, {N: 1, C: 1}}
	for _, tc := range []struct {
		k         int
		wantValue float64
		wantTasks int
	}{
		{1, (0.3 + 0 + 1) / 3, 3},
		{5, (1 - 21.0/252) / 2, 2},
		{11, 0, 0},
	} {
		got := stats.PassAtKOver(tasks, tc.k, 500, 1)
		if !near(got.Value, tc.wantValue, tol) || got.Tasks != tc.wantTasks {
			t.Errorf("PassAtKOver(k=%d) = %v over %d tasks, want %v over %d", tc.k, got.Value, got.Tasks, tc.wantValue, tc.wantTasks)
		}
		if !contains(got.CI, got.Value) {
			t.Errorf("PassAtKOver(k=%d): CI %+v misses %v", tc.k, got.CI, got.Value)
		}
	}
	if got := stats.PassAtKOver(nil, 1, 0, 1); got != (stats.Estimate{CI: stats.Interval{Lo: 0, Hi: 1}}) {
		t.Errorf("PassAtKOver(nil) = %+v, want zero value with CI {0, 1}", got)
	}
}

// TestPassAtKOverWidth: with one attempt per task the bootstrap interval is close to the
// textbook one for a proportion, and identical tasks leave no uncertainty.
func TestPassAtKOverWidth(t *testing.T) {
	var tasks []stats.Attempts
	for i := range 200 {
		tasks = append(tasks, stats.Attempts{N: 1, C: i % 2})
	}
	got := stats.PassAtKOver(tasks, 1, 0, 7)
	half := 1.96 * math.Sqrt(0.5*0.5/200)
	if !near(got.CI.Lo, 0.5-half, 0.01) || !near(got.CI.Hi, 0.5+half, 0.01) {
		t.Errorf("PassAtKOver(100/200) CI = %+v, want about {%.3f, %.3f}", got.CI, 0.5-half, 0.5+half)
	}
	same := slices.Repeat([]stats.Attempts{{N: 4, C: 1}}, 30)
	if got := stats.PassAtKOver(same, 2, 0, 7); got.CI != (stats.Interval{Lo: 0.5, Hi: 0.5}) {
		t.Errorf("PassAtKOver(identical tasks) CI = %+v, want {0.5, 0.5}", got.CI)
	}
}

// TestBootstrapSeed: a seed fixes the interval, so a regenerated report does not change.
func TestBootstrapSeed(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	var tasks []stats.Attempts
	a, b := make([]float64, 40), make([]float64, 40)
	for i := range 40 {
		tasks = append(tasks, stats.Attempts{N: 5, C: r.IntN(6)})
		a[i], b[i] = float64(r.IntN(2)), float64(r.IntN(2))
	}
	if x, y := stats.PassAtKOver(tasks, 2, 300, 9), stats.PassAtKOver(tasks, 2, 300, 9); x != y {
		t.Errorf("PassAtKOver with seed 9 gave %+v then %+v", x, y)
	}
	x, _ := stats.ComparePaired(a, b, 300, 9)
	y, _ := stats.ComparePaired(a, b, 300, 9)
	if diff := cmp.Diff(x, y); diff != "" {
		t.Errorf("ComparePaired with seed 9 differs between calls (-first +second):\n%s", diff)
	}
	differ := false
	for seed := uint64(10); seed < 20 && !differ; seed++ {
		differ = stats.PassAtKOver(tasks, 2, 300, seed).CI != stats.PassAtKOver(tasks, 2, 300, 9).CI
	}
	if !differ {
		t.Error("PassAtKOver gave the same interval for seeds 9 to 19")
	}
}

// TestIntervalsContainEstimate holds over random suites, including tiny skewed ones where the
// percentiles alone could miss the estimate.
func TestIntervalsContainEstimate(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	for trial := range 200 {
		n := 1 + r.IntN(12)
		tasks := make([]stats.Attempts, n)
		a, b := make([]float64, n), make([]float64, n)
		for i := range n {
			tasks[i].N = 1 + r.IntN(6)
			tasks[i].C = r.IntN(tasks[i].N + 1)
			a[i], b[i] = r.Float64(), float64(r.IntN(2))
		}
		if e := stats.PassAtKOver(tasks, 1+r.IntN(3), 50, uint64(trial)); !contains(e.CI, e.Value) {
			t.Errorf("trial %d: PassAtKOver CI %+v misses %v", trial, e.CI, e.Value)
		}
		p, err := stats.ComparePaired(a, b, 50, uint64(trial))
		if err != nil {
			t.Fatal(err)
		}
		if !contains(p.DiffCI, p.Diff) {
			t.Errorf("trial %d: ComparePaired DiffCI %+v misses %v", trial, p.DiffCI, p.Diff)
		}
	}
}

// outcomes builds 0/1 vectors where A alone passes betterA tasks, B alone betterB, and both pass
// ties more.
func outcomes(betterA, betterB, ties int) (a, b []float64) {
	for range betterA {
		a, b = append(a, 1), append(b, 0)
	}
	for range betterB {
		a, b = append(a, 0), append(b, 1)
	}
	for range ties {
		a, b = append(a, 1), append(b, 1)
	}
	return a, b
}

func TestComparePairedMcNemar(t *testing.T) {
	for _, tc := range []struct {
		betterA, betterB int
		want             float64
		eps              float64
	}{
		{0, 5, 0.0625, 1e-12},
		{5, 0, 0.0625, 1e-12},
		{1, 9, 0.021484375, 1e-12},
		{3, 3, 1, 1e-12},
		{0, 0, 1, 0},
		{2, 8, 0.109375, 1e-12},
		// Far past where 2^-n underflows; the value is the exact rational sum, rounded.
		{900, 1100, 8.457089535503927e-06, 1e-11},
		{1500, 1500, 1, 1e-12},
	} {
		a, b := outcomes(tc.betterA, tc.betterB, 4)
		got, err := stats.ComparePaired(a, b, 100, 1)
		if err != nil {
			t.Fatal(err)
		}
		if got.BetterA != tc.betterA || got.BetterB != tc.betterB {
			t.Errorf("ComparePaired(%d/%d) counted BetterA %d, BetterB %d", tc.betterA, tc.betterB, got.BetterA, got.BetterB)
		}
		if !near(got.PValue, tc.want, tc.eps) {
			t.Errorf("ComparePaired(BetterA %d, BetterB %d).PValue = %v, want %v", tc.betterA, tc.betterB, got.PValue, tc.want)
		}
	}
	// So many one-sided trials underflow to 0 rather than turning into NaN.
	a, b := outcomes(0, 3000, 0)
	if got, _ := stats.ComparePaired(a, b, 10, 1); got.PValue != 0 {
		t.Errorf("ComparePaired(BetterA 0, BetterB 3000).PValue = %v, want 0", got.PValue)
	}
}

func TestComparePaired(t *testing.T) {
	a := []float64{0, 0, 0, 0, 0, 1, 1, 0.5}
	b := []float64{1, 1, 1, 1, 1, 1, 1, 0.25}
	got, err := stats.ComparePaired(a, b, 1000, 42)
	if err != nil {
		t.Fatal(err)
	}
	if !contains(got.DiffCI, got.Diff) || got.DiffCI.Lo <= 0 {
		t.Errorf("DiffCI = %+v, want an interval above 0 containing %v", got.DiffCI, got.Diff)
	}
	got.DiffCI = stats.Interval{}
	want := stats.Paired{
		Tasks: 8, MeanA: 2.5 / 8, MeanB: 7.25 / 8, Diff: 4.75 / 8,
		BetterA: 1, BetterB: 5, PValue: 0.21875,
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(x, y float64) bool { return near(x, y, tol) })); diff != "" {
		t.Errorf("ComparePaired mismatch (-want +got):\n%s", diff)
	}

	same := []float64{0, 1, 0.5, 1, 0.25}
	got, err = stats.ComparePaired(same, same, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got.Diff != 0 || got.PValue != 1 || !contains(got.DiffCI, 0) || got.BetterA+got.BetterB != 0 {
		t.Errorf("ComparePaired(x, x) = %+v, want Diff 0, PValue 1, no better tasks, CI containing 0", got)
	}
}

func TestComparePairedErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b []float64
	}{
		{"length mismatch", []float64{0, 1}, []float64{1}},
		{"empty", nil, nil},
		{"above 1", []float64{0, 1.5}, []float64{1, 1}},
		{"negative", []float64{0, 1}, []float64{-0.1, 1}},
		{"NaN", []float64{math.NaN()}, []float64{1}},
	} {
		if _, err := stats.ComparePaired(tc.a, tc.b, 10, 1); err == nil {
			t.Errorf("ComparePaired(%s) succeeded, want an error", tc.name)
		}
	}
}

// TestJSON: reports read these field names.
func TestJSON(t *testing.T) {
	raw, err := json.Marshal(stats.Paired{Tasks: 2, DiffCI: stats.Interval{Lo: -1, Hi: 1}})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"tasks":     2.0,
		"mean_a":    0.0,
		"mean_b":    0.0,
		"diff":      0.0,
		"diff_ci95": map[string]any{"lo": -1.0, "hi": 1.0},
		"better_a":  0.0,
		"better_b":  0.0,
		"p_value":   0.0,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Paired JSON mismatch (-want +got):\n%s", diff)
	}
	raw, _ = json.Marshal(stats.Estimate{Value: 0.5, Tasks: 3, CI: stats.Interval{Lo: 0.25, Hi: 0.75}})
	if want := `{"value":0.5,"tasks":3,"ci95":{"lo":0.25,"hi":0.75}}`; string(raw) != want {
		t.Errorf("Estimate JSON = %s, want %s", raw, want)
	}
}
