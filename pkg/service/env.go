package service

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Var documents one environment variable of a service: its name, what it
// sets, and a valid value other than the default (tests set each to its
// example and check that the running service takes it).
type Var struct {
	Name    string
	Help    string
	Example string
}

// Env reads typed settings from environment variables. Every reader leaves
// its destination alone when the variable is unset (or blank), and records a
// problem, naming the variable, its value and what is wanted, when it is set
// to something it cannot use; Err reports them all at once, so that a
// misconfigured service says everything that is wrong in one start.
type Env struct {
	getenv func(string) string
	errs   []error
}

// NewEnv reads through getenv (os.Getenv, or a map in tests); nil reads an
// empty environment.
func NewEnv(getenv func(string) string) *Env {
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	return &Env{getenv: getenv}
}

// Lookup returns the variable's value with surrounding spaces trimmed, and
// whether it is set to something.
func (e *Env) Lookup(name string) (string, bool) {
	v := strings.TrimSpace(e.getenv(name))
	return v, v != ""
}

// Raw returns the variable's value as it is (no trimming), "" when unset.
func (e *Env) Raw(name string) string { return e.getenv(name) }

// Fail records a problem with a variable's value: want says what would do.
func (e *Env) Fail(name, value, want string) {
	e.errs = append(e.errs, fmt.Errorf("%s=%q: %s", name, value, want))
}

// Check records err, when not nil, as a problem with the variable.
func (e *Env) Check(name, value string, err error) {
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q: %w", name, value, err))
	}
}

// Err returns every problem recorded, joined, or nil.
func (e *Env) Err() error { return errors.Join(e.errs...) }

// String sets dst to the variable's trimmed value.
func (e *Env) String(name string, dst *string) {
	if v, ok := e.Lookup(name); ok {
		*dst = v
	}
}

// Text sets dst to the variable's trimmed value, refusing control characters
// and values longer than maxLen.
func (e *Env) Text(name string, maxLen int, dst *string) {
	v, ok := e.Lookup(name)
	if !ok {
		return
	}
	if len(v) > maxLen || strings.ContainsFunc(v, unicode.IsControl) {
		e.Fail(name, v, fmt.Sprintf("want at most %d printable characters", maxLen))
		return
	}
	*dst = v
}

// Int sets dst to a whole number from lo to hi.
func (e *Env) Int(name string, lo, hi int, dst *int) {
	v, ok := e.Lookup(name)
	if !ok {
		return
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		e.Fail(name, v, fmt.Sprintf("want a whole number from %d to %d", lo, hi))
		return
	}
	*dst = n
}

// Scaled sets dst to a whole number from lo to hi, multiplied by unit (a
// variable counted in MiB sets bytes).
func (e *Env) Scaled(name string, lo, hi, unit int64, dst *int64) {
	v, ok := e.Lookup(name)
	if !ok {
		return
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo || n > hi {
		e.Fail(name, v, fmt.Sprintf("want a whole number from %d to %d", lo, hi))
		return
	}
	*dst = n * unit
}

// Float sets dst to a finite number from lo to hi.
func (e *Env) Float(name string, lo, hi float64, dst *float64) {
	v, ok := e.Lookup(name)
	if !ok {
		return
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f != f || f < lo || f > hi {
		e.Fail(name, v, fmt.Sprintf("want a number from %g to %g", lo, hi))
		return
	}
	*dst = f
}

// Duration sets dst to a Go duration (500ms, 30s, 2m) from lo to hi.
func (e *Env) Duration(name string, lo, hi time.Duration, dst *time.Duration) {
	v, ok := e.Lookup(name)
	if !ok {
		return
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < lo || d > hi {
		e.Fail(name, v, fmt.Sprintf("want a duration from %s to %s, for example %s", lo, hi, exampleDuration(lo, hi)))
		return
	}
	*dst = d
}

func exampleDuration(lo, hi time.Duration) time.Duration {
	for _, d := range []time.Duration{30 * time.Second, time.Second, 500 * time.Millisecond, time.Minute, 10 * time.Millisecond} {
		if d >= lo && d <= hi {
			return d
		}
	}
	return lo
}

// Bool sets dst from 1/true/yes/on or 0/false/no/off (any case).
func (e *Env) Bool(name string, dst *bool) {
	v, ok := e.Lookup(name)
	if !ok {
		return
	}
	switch strings.ToLower(v) {
	case "1", "true", "yes", "on":
		*dst = true
	case "0", "false", "no", "off":
		*dst = false
	default:
		e.Fail(name, v, "want 1 or 0 (true or false)")
	}
}

// Enum sets dst to the value when it is one of allowed (exact match).
func (e *Env) Enum(name string, allowed []string, dst *string) {
	v, ok := e.Lookup(name)
	if !ok {
		return
	}
	for _, a := range allowed {
		if v == a {
			*dst = v
			return
		}
	}
	e.Fail(name, v, "want one of "+strings.Join(allowed, ", "))
}

// List sets dst to the variable's comma-separated items, trimmed, empty ones
// dropped.
func (e *Env) List(name string, dst *[]string) {
	v, ok := e.Lookup(name)
	if !ok {
		return
	}
	var out []string
	for item := range strings.SplitSeq(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	*dst = out
}
