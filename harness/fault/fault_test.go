package fault_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/infradev/infradev/harness/fault"
)

type specProblem struct{}

func (specProblem) Error() string           { return "task.yaml:3: id: required" }
func (specProblem) FaultClass() fault.Class { return fault.Input }

func TestClassOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want fault.Class
		code int
	}{
		{"unclassified is the infrastructure's", errors.New("disk full"), fault.Infra, 3},
		{"wrapped with context keeps its class", fmt.Errorf("eval: %w", fault.Inputf("--match: bad pattern")), fault.Input, 2},
		{"a type that knows its class", fmt.Errorf("loading: %w", specProblem{}), fault.Input, 2},
		{"the outermost class wins", fault.Wrap(fault.Infra, fmt.Errorf("building: %w", specProblem{})), fault.Infra, 3},
		{"a failed check", fault.Checkf("not as locked"), fault.Check, 1},
		{"a broken task", fault.Taskf("not at base"), fault.Task, 2},
		{"a cancelled context", fmt.Errorf("run: %w", context.Canceled), fault.Interrupted, 130},
	} {
		if got := fault.ClassOf(tc.err); got != tc.want || got.ExitCode() != tc.code {
			t.Errorf("%s: ClassOf(%v) = %s (exit %d), want %s (exit %d)", tc.name, tc.err, got, got.ExitCode(), tc.want, tc.code)
		}
	}
	if fault.Wrap(fault.Input, nil) != nil {
		t.Errorf("Wrap(nil) is not nil")
	}
}
