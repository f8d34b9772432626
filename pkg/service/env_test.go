package service_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/service"
)

func TestEnvReaders(t *testing.T) {
	vars := map[string]string{
		"N": " 7 ", "D": "250ms", "B": "yes", "F": "0.5", "S": " text ", "L": "a, b,,c ", "E": "gvisor", "M": "3",
		"T": "ok",
	}
	e := service.NewEnv(func(k string) string { return vars[k] })
	var (
		n       int
		d       time.Duration
		b       bool
		f       float64
		s, en   string
		tx      string
		l       []string
		m       int64
		unset   = 42
		unsetD  = time.Second
		unsetS  = "keep"
		unsetB  = true
		unsetL  = []string{"x"}
		unsetIn int64
	)
	e.Int("N", 1, 10, &n)
	e.Duration("D", time.Millisecond, time.Second, &d)
	e.Bool("B", &b)
	e.Float("F", 0, 1, &f)
	e.String("S", &s)
	e.Text("T", 10, &tx)
	e.List("L", &l)
	e.Enum("E", []string{"auto", "gvisor"}, &en)
	e.Scaled("M", 1, 10, 1<<20, &m)
	e.Int("X", 1, 10, &unset)
	e.Duration("X", time.Millisecond, time.Second, &unsetD)
	e.String("X", &unsetS)
	e.Bool("X", &unsetB)
	e.List("X", &unsetL)
	e.Scaled("X", 1, 2, 3, &unsetIn)
	require.NoError(t, e.Err())
	require.Equal(t, 7, n)
	require.Equal(t, 250*time.Millisecond, d)
	require.True(t, b)
	require.InDelta(t, 0.5, f, 0)
	require.Equal(t, "text", s)
	require.Equal(t, "ok", tx)
	require.Equal(t, []string{"a", "b", "c"}, l)
	require.Equal(t, "gvisor", en)
	require.Equal(t, int64(3<<20), m)
	require.Equal(t, 42, unset, "an unset variable leaves the default")
	require.Equal(t, time.Second, unsetD)
	require.Equal(t, "keep", unsetS)
	require.True(t, unsetB)
	require.Equal(t, []string{"x"}, unsetL)
	require.Zero(t, unsetIn)
}

// Every bad value is refused with the variable, the value and what is
// wanted, all in one error; the destination keeps its value.
func TestEnvRejects(t *testing.T) {
	cases := []struct {
		name, value, msg string
		read             func(e *service.Env)
	}{
		{"int", "many", `INT="many": want a whole number from 1 to 10`, func(e *service.Env) { var n int; e.Int("INT", 1, 10, &n) }},
		{"int range", "11", `INT="11": want a whole number from 1 to 10`, func(e *service.Env) { var n int; e.Int("INT", 1, 10, &n) }},
		{"duration", "soon", `DUR="soon": want a duration from 10ms to 1m0s, for example 30s`, func(e *service.Env) {
			var d time.Duration
			e.Duration("DUR", 10*time.Millisecond, time.Minute, &d)
		}},
		{"duration range", "1ms", `DUR="1ms": want a duration from 10ms to 1m0s`, func(e *service.Env) {
			var d time.Duration
			e.Duration("DUR", 10*time.Millisecond, time.Minute, &d)
		}},
		{"bool", "maybe", `BOOL="maybe": want 1 or 0 (true or false)`, func(e *service.Env) { var b bool; e.Bool("BOOL", &b) }},
		{"float NaN", "NaN", `FLOAT="NaN": want a number from 0 to 1`, func(e *service.Env) { var f float64; e.Float("FLOAT", 0, 1, &f) }},
		{"enum", "docker", `ENUM="docker": want one of auto, gvisor, bwrap`, func(e *service.Env) {
			var s string
			e.Enum("ENUM", []string{"auto", "gvisor", "bwrap"}, &s)
		}},
		{"text control", "a\x00b", `TEXT="a\x00b": want at most 8 printable characters`, func(e *service.Env) { var s string; e.Text("TEXT", 8, &s) }},
		{"scaled", "-1", `SCALED="-1": want a whole number from 1 to 5`, func(e *service.Env) { var n int64; e.Scaled("SCALED", 1, 5, 1024, &n) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := service.NewEnv(func(string) string { return tc.value })
			tc.read(e)
			require.ErrorContains(t, e.Err(), tc.msg)
		})
	}
	e := service.NewEnv(func(string) string { return "x" })
	var a, b int
	e.Int("A", 1, 2, &a)
	e.Int("B", 1, 2, &b)
	require.EqualError(t, e.Err(), "A=\"x\": want a whole number from 1 to 2\nB=\"x\": want a whole number from 1 to 2")
	require.NoError(t, service.NewEnv(nil).Err())
}
