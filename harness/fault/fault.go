// Package fault owns the classes of failure and the exit code each maps to. An error is
// classified once, where its cause is known (a spec file is wrong: input; a sandbox or server
// failed: infrastructure; a task's own files are broken: task), by wrapping it or by its type
// implementing Classified; everything above passes it on with context, and the command line
// maps the class to an exit code in one place. An error nobody classified is an
// infrastructure fault: it is never blamed on the user's input or on a submission.
package fault

import (
	"context"
	"errors"
	"fmt"
)

// Class is what a failure is the fault of.
type Class int

const (
	// Infra is the machine's or a service's fault (sandbox, store, network, a server).
	Infra Class = iota
	// Input is the caller's: bad usage, a bad spec or predictions file, a bad pattern.
	Input
	// Task is the task's own: its files or commits are broken, decided without a submission.
	Task
	// Check is a check or verdict that did not pass (not resolved, not as locked, not current).
	Check
	// Interrupted is a run stopped by a signal; what finished is kept.
	Interrupted
)

func (c Class) String() string {
	switch c {
	case Input:
		return "input"
	case Task:
		return "task"
	case Check:
		return "check"
	case Interrupted:
		return "interrupted"
	}
	return "infrastructure"
}

// ExitCode is the documented exit code of each class: 1 a check failed, 2 bad usage or input
// (and a broken task), 3 an infrastructure fault, 130 interrupted.
func (c Class) ExitCode() int {
	switch c {
	case Input, Task:
		return 2
	case Check:
		return 1
	case Interrupted:
		return 130
	}
	return 3
}

// Classified is implemented by error types that know their class.
type Classified interface{ FaultClass() Class }

// Error is an error with its class.
type Error struct {
	Class Class
	Err   error
}

func (e *Error) Error() string     { return e.Err.Error() }
func (e *Error) Unwrap() error     { return e.Err }
func (e *Error) FaultClass() Class { return e.Class }

// Wrap classifies err (nil stays nil).
func Wrap(c Class, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Class: c, Err: err}
}

// Inputf, Infraf, Taskf and Checkf make classified errors.
func Inputf(format string, args ...any) error { return Wrap(Input, fmt.Errorf(format, args...)) }
func Infraf(format string, args ...any) error { return Wrap(Infra, fmt.Errorf(format, args...)) }
func Taskf(format string, args ...any) error  { return Wrap(Task, fmt.Errorf(format, args...)) }
func Checkf(format string, args ...any) error { return Wrap(Check, fmt.Errorf(format, args...)) }

// ClassOf is err's class: the outermost classification in its chain, Interrupted for a
// cancelled context, and Infra for an error nobody classified.
func ClassOf(err error) Class {
	var c Classified
	if errors.As(err, &c) {
		return c.FaultClass()
	}
	if errors.Is(err, context.Canceled) {
		return Interrupted
	}
	return Infra
}
