// Package stats owns the statistics a benchmark report uses to compare coding agents: pass@k
// estimates, confidence intervals for proportions and means, and paired comparisons of two
// variants over the same tasks. Every estimate comes with its uncertainty, because with tens or
// hundreds of tasks a few points of difference between agents is often noise. Random resampling
// takes an explicit seed so a report regenerated from the same results is byte-identical.
package stats

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// PassAtK is the unbiased estimator of pass@k from n attempts of which c passed:
// 1 - C(n-c, k) / C(n, k) (Chen et al., 2021). It is computed as a product of ratios because the
// binomial coefficients overflow float64 long before n reaches the attempt counts reports use.
// k > n, k < 1 or n == 0 gives NaN: those attempts say nothing about pass@k.
func PassAtK(n, c, k int) float64 {
	if n <= 0 || k < 1 || k > n {
		return math.NaN()
	}
	c = min(max(c, 0), n)
	if n-c < k {
		// Every k-subset contains a passing attempt.
		return 1
	}
	// C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k/i).
	fail := 1.0
	for i := n - c + 1; i <= n; i++ {
		fail *= 1 - float64(k)/float64(i)
	}
	return 1 - fail
}

// Interval is a two-sided confidence interval.
type Interval struct {
	Lo float64 `json:"lo"`
	Hi float64 `json:"hi"`
}

// Wilson is the 95% Wilson score interval for successes out of n. It is used instead of the
// normal approximation because that one collapses to a zero-width interval at 0 or n successes,
// which is exactly where small task suites often land. n == 0 gives {0, 1}: nothing is known.
func Wilson(successes, n int) Interval {
	if n <= 0 {
		return Interval{0, 1}
	}
	s := min(max(successes, 0), n)
	nf := float64(n)
	p := float64(s) / nf
	z2 := z95 * z95
	denom := 1 + z2/nf
	center := (p + z2/(2*nf)) / denom
	half := z95 / denom * math.Sqrt(p*(1-p)/nf+z2/(4*nf*nf))
	iv := Interval{Lo: max(0, center-half), Hi: min(1, center+half)}
	// The bounds are exactly 0 and 1 at the extremes; rounding would otherwise leave an interval
	// that misses its own proportion by an ulp.
	if s == 0 {
		iv.Lo = 0
	}
	if s == n {
		iv.Hi = 1
	}
	return iv
}

// Attempts are one task's attempts: N tried, C passed.
type Attempts struct{ N, C int }

// Estimate is a mean over tasks with a 95% confidence interval.
type Estimate struct {
	Value float64  `json:"value"`
	Tasks int      `json:"tasks"`
	CI    Interval `json:"ci95"`
}

// PassAtKOver is the mean of PassAtK over tasks with a percentile bootstrap 95% interval from
// resampling tasks with replacement iters times (iters <= 0 means 2000). Tasks are the unit of
// resampling because attempts on one task are correlated; resampling attempts would understate
// the uncertainty. Tasks with N < k are skipped, since they cannot estimate pass@k; Tasks says
// how many were used. With none, Value is 0 and CI is {0, 1}.
func PassAtKOver(tasks []Attempts, k, iters int, seed uint64) Estimate {
	var vals []float64
	for _, t := range tasks {
		if v := PassAtK(t.N, t.C, k); !math.IsNaN(v) {
			vals = append(vals, v)
		}
	}
	if len(vals) == 0 {
		return Estimate{CI: Interval{0, 1}}
	}
	m := mean(vals)
	return Estimate{Value: m, Tasks: len(vals), CI: bootstrapMean(vals, m, iters, seed)}
}

// Paired compares two variants (e.g. two prompts, or one model with and without a skill) over
// the same tasks. Pairing by task removes the large task-to-task variation in difficulty from
// the comparison, so it detects differences that two independent intervals would hide.
type Paired struct {
	Tasks int     `json:"tasks"`
	MeanA float64 `json:"mean_a"`
	MeanB float64 `json:"mean_b"`
	// Diff is MeanB - MeanA.
	Diff float64 `json:"diff"`
	// DiffCI is a paired percentile bootstrap 95% interval over tasks for Diff.
	DiffCI Interval `json:"diff_ci95"`
	// BetterA and BetterB count the tasks where a[i] > b[i] and b[i] > a[i]; ties carry no
	// information about which variant is better and are left out of the sign test.
	BetterA int `json:"better_a"`
	BetterB int `json:"better_b"`
	// PValue is the exact two-sided binomial sign test (p = 0.5) on BetterA+BetterB trials; with
	// 0/1 outcomes this is the exact McNemar test.
	PValue float64 `json:"p_value"`
}

// ComparePaired compares a and b, where a[i] and b[i] are task i's success rates in [0, 1] (the
// share of its attempts resolved; with one attempt each, 0 or 1). iters <= 0 means 2000 bootstrap
// resamples. It fails when the lengths differ, there are no tasks, or a rate is outside [0, 1].
func ComparePaired(a, b []float64, iters int, seed uint64) (Paired, error) {
	if len(a) != len(b) {
		return Paired{}, fmt.Errorf("stats: %d rates for variant A but %d for variant B", len(a), len(b))
	}
	if len(a) == 0 {
		return Paired{}, errors.New("stats: no tasks to compare")
	}
	diffs := make([]float64, len(a))
	var p Paired
	for i := range a {
		for _, v := range [2]float64{a[i], b[i]} {
			if !(v >= 0 && v <= 1) {
				return Paired{}, fmt.Errorf("stats: task %d: rate %v outside [0, 1]", i, v)
			}
		}
		diffs[i] = b[i] - a[i]
		switch {
		case b[i] > a[i]:
			p.BetterB++
		case a[i] > b[i]:
			p.BetterA++
		}
	}
	p.Tasks = len(a)
	p.MeanA, p.MeanB = mean(a), mean(b)
	p.Diff = p.MeanB - p.MeanA
	p.DiffCI = bootstrapMean(diffs, p.Diff, iters, seed)
	p.PValue = signTest(p.BetterA, p.BetterB)
	return p, nil
}

// z95 is the standard normal quantile for a two-sided 95% interval.
const z95 = 1.959963984540054

const defaultIters = 2000

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// bootstrapMean is the percentile bootstrap 95% interval for the mean of xs. The interval is
// widened to contain point when needed: with few or skewed values the percentiles can exclude the
// estimate by a hair, and a report showing an interval that misses its own value reads as a bug.
func bootstrapMean(xs []float64, point float64, iters int, seed uint64) Interval {
	if iters <= 0 {
		iters = defaultIters
	}
	rng := rand.New(rand.NewPCG(seed, seed))
	means := make([]float64, iters)
	for it := range means {
		var s float64
		for range xs {
			s += xs[rng.IntN(len(xs))]
		}
		means[it] = s / float64(len(xs))
	}
	slices.Sort(means)
	return Interval{
		Lo: min(quantile(means, 0.025), point),
		Hi: max(quantile(means, 0.975), point),
	}
}

// quantile interpolates linearly between order statistics of sorted.
func quantile(sorted []float64, q float64) float64 {
	pos := q * float64(len(sorted)-1)
	i := int(pos)
	if i+1 >= len(sorted) {
		return sorted[len(sorted)-1]
	}
	f := pos - float64(i)
	return sorted[i]*(1-f) + sorted[i+1]*f
}

// signTest is the exact two-sided binomial test with p = 0.5: min(1, 2 P(X <= min(x, y))) for
// X ~ Binomial(x+y, 1/2). Terms are summed in log space because 2^-n underflows for the
// thousands of trials a large suite with many attempts produces.
func signTest(x, y int) float64 {
	n := x + y
	if n == 0 {
		return 1
	}
	m := min(x, y)
	logs := make([]float64, m+1)
	for i := range logs {
		logs[i] = logChoose(n, i) - float64(n)*math.Ln2
	}
	top := slices.Max(logs)
	var s float64
	for _, l := range logs {
		s += math.Exp(l - top)
	}
	return min(1, 2*math.Exp(top+math.Log(s)))
}

func logChoose(n, k int) float64 {
	a, _ := math.Lgamma(float64(n + 1))
	b, _ := math.Lgamma(float64(k + 1))
	c, _ := math.Lgamma(float64(n - k + 1))
	return a - b - c
}
