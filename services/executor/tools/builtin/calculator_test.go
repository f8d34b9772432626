package builtin

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEvaluate(t *testing.T) {
	tests := []struct {
		expr string
		want float64
	}{
		{"1+2*3", 7},
		{"(1+2)*3", 9},
		{"  42  ", 42},
		{"1 - 2 - 3", -4},   // left-associative
		{"100 / 10 / 5", 2}, // left-associative
		{"2^3^2", 512},      // right-associative
		{"-2^2", -4},        // unary minus binds looser than ^
		{"(-2)^2", 4},
		{"2^-1", 0.5}, // a unary minus in an exponent
		{"--3", 3},
		{"+-+3", -3},
		{"10 % 4", 2},
		{"-7 % 3", -1}, // the remainder has the dividend's sign
		{"7.5 % 2", 1.5},
		{"7/2", 3.5},
		{"1.5 + .5", 2}, // decimal forms
		{"3.", 3},
		{"((((2))))", 2},
		{"2 * (3 + 4) ^ 2 / -7", -14},
		{"0.1 + 0.2", 0.30000000000000004},
		{"-0", 0}, // never a negative zero
		{"0^0", 1},
		{"\t1\n+\r1", 2},
	}
	for _, tc := range tests {
		t.Run(tc.expr, func(t *testing.T) {
			got, err := Evaluate(tc.expr)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			require.False(t, math.Signbit(got) && got == 0, "negative zero")
		})
	}
}

func TestEvaluateErrors(t *testing.T) {
	tests := []struct {
		expr    string
		wantPos int
		wantMsg string
	}{
		{"1/0", 2, "division by zero"},
		{"1 / (2 - 2)", 3, "division by zero"},
		{"5 % 0", 3, "remainder of division by zero"},
		{"0^-1", 2, "division by zero"},
		{"", 1, "unexpected end of expression"},
		{"   ", 4, "unexpected end of expression"},
		{"1+", 3, "unexpected end of expression"},
		{"1 2", 3, `unexpected '2'`},
		{"(1+2", 5, "missing ')' to close the '(' at position 1"},
		{"(1+2]", 5, `expected ')' to close the '(' at position 1, found ']'`},
		{"1+2)", 4, `unexpected ')'`},
		{"abc", 1, `unexpected 'a', expected a number or '('`},
		{"2 ** 3", 4, `unexpected '*'`},
		{"1.2.3", 4, "a second '.'"},
		{".", 1, "malformed number"},
		{"1e5", 2, `unexpected 'e'`},
		{"é+1", 1, `unexpected 'é'`},
		{"10^400", 3, "too large"},
		{"(-8)^(1/3)", 5, "not a real number"},
	}
	for _, tc := range tests {
		t.Run(tc.expr, func(t *testing.T) {
			_, err := Evaluate(tc.expr)
			var ee *ExprError
			require.True(t, errors.As(err, &ee), "want an ExprError, got %v", err)
			require.Equal(t, tc.wantPos, ee.Pos, "position in %v", err)
			require.Contains(t, ee.Msg, tc.wantMsg)
			require.Contains(t, err.Error(), "at position")
		})
	}
}

func TestEvaluateLimits(t *testing.T) {
	_, err := Evaluate(strings.Repeat("1", maxExpressionLen+1))
	require.ErrorContains(t, err, "at most 256")

	_, err = Evaluate("1+\xff")
	require.ErrorContains(t, err, "UTF-8")

	deep := strings.Repeat("(", 127) + "1" + strings.Repeat(")", 127)
	v, err := Evaluate(deep)
	require.NoError(t, err)
	require.Equal(t, 1.0, v)

	v, err = Evaluate(strings.Repeat("-", maxExpressionLen-1) + "1")
	require.NoError(t, err)
	require.Equal(t, -1.0, v)
}

// FuzzEvaluate checks that no input of the allowed size panics, and that a
// result is always a finite number JSON can carry.
func FuzzEvaluate(f *testing.F) {
	for _, s := range []string{"1+2*3", "2^3^2", "-(4%3)/0.5", "((1)", "1/0", "9^9^9", ".5--.5", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		v, err := Evaluate(expr)
		if err != nil {
			return
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			t.Fatalf("Evaluate(%q) = %v", expr, v)
		}
	})
}
