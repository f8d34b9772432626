package builtin

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// maxExpressionLen bounds a calculator expression, in bytes; it also bounds the
// parser's recursion.
const maxExpressionLen = 256

type calculatorTool struct{}

type calculatorIn struct {
	Expression string `json:"expression"`
}

type calculatorOut struct {
	Result float64 `json:"result"`
}

func (calculatorTool) Definition() envelope.ToolDefinition {
	return toolapi.BuiltinDefinition("calculator",
		"Evaluates an arithmetic expression: decimal numbers, + - * / % ^ (power, right-associative), unary minus and parentheses.",
		envelope.CategoryUtility,
		`{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "expression": {"type": "string", "minLength": 1, "maxLength": 256,
      "description": "The expression, for example (2 + 3) * 4 ^ 2 / -5."}
  },
  "required": ["expression"],
  "additionalProperties": false
}`,
		`{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {"result": {"type": "number"}},
  "required": ["result"],
  "additionalProperties": false
}`)
}

func (calculatorTool) Execute(_ context.Context, input json.RawMessage, _ toolapi.Context) (json.RawMessage, error) {
	var in calculatorIn
	if err := toolapi.DecodeInput("calculator", input, &in); err != nil {
		return nil, err
	}
	v, err := Evaluate(in.Expression)
	if err != nil {
		return nil, envelope.NewToolError(envelope.CodeValidation, "calculator: %v", err)
	}
	return json.Marshal(calculatorOut{Result: v})
}

// ExprError is a calculator expression's syntax or arithmetic error at a
// position: the 1-based index of the character where it was found.
type ExprError struct {
	Pos int
	Msg string
}

func (e *ExprError) Error() string { return fmt.Sprintf("%s at position %d", e.Msg, e.Pos) }

// Evaluate computes an arithmetic expression with a recursive-descent parser:
//
//	expr    = term { ("+" | "-") term }
//	term    = unary { ("*" | "/" | "%") unary }
//	unary   = ("-" | "+") unary | power
//	power   = primary [ "^" unary ]          (right-associative)
//	primary = number | "(" expr ")"
//	number  = digits [ "." { digit } ] | "." digits
//
// So -2^2 is -4 and 2^-1 is 0.5; % is the remainder with the dividend's sign.
// Division or remainder by zero, and results that are not finite real numbers,
// are errors, as is anything that does not parse.
func Evaluate(expr string) (float64, error) {
	if len(expr) > maxExpressionLen {
		return 0, fmt.Errorf("expression is %d bytes long; at most %d are allowed", len(expr), maxExpressionLen)
	}
	if !utf8.ValidString(expr) {
		return 0, fmt.Errorf("expression is not valid UTF-8")
	}
	p := &calcParser{src: []rune(expr)}
	v, err := p.expr()
	if err != nil {
		return 0, err
	}
	p.skipSpace()
	if p.pos < len(p.src) {
		return 0, p.errorf(p.pos, "unexpected %q", p.src[p.pos])
	}
	if v == 0 {
		v = 0 // no negative zero in the output
	}
	return v, nil
}

type calcParser struct {
	src []rune
	pos int // index of the next character
}

func (p *calcParser) errorf(at int, format string, args ...any) error {
	return &ExprError{Pos: at + 1, Msg: fmt.Sprintf(format, args...)}
}

func (p *calcParser) skipSpace() {
	for p.pos < len(p.src) {
		switch p.src[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// peek skips spaces and returns the next character, or 0 at the end.
func (p *calcParser) peek() rune {
	p.skipSpace()
	if p.pos >= len(p.src) {
		return 0
	}
	return p.src[p.pos]
}

func (p *calcParser) expr() (float64, error) {
	v, err := p.term()
	if err != nil {
		return 0, err
	}
	for {
		op := p.peek()
		if op != '+' && op != '-' {
			return v, nil
		}
		at := p.pos
		p.pos++
		r, err := p.term()
		if err != nil {
			return 0, err
		}
		if op == '+' {
			v += r
		} else {
			v -= r
		}
		if err := p.finite(v, at); err != nil {
			return 0, err
		}
	}
}

func (p *calcParser) term() (float64, error) {
	v, err := p.unary()
	if err != nil {
		return 0, err
	}
	for {
		op := p.peek()
		if op != '*' && op != '/' && op != '%' {
			return v, nil
		}
		at := p.pos
		p.pos++
		r, err := p.unary()
		if err != nil {
			return 0, err
		}
		switch op {
		case '*':
			v *= r
		case '/':
			if r == 0 {
				return 0, p.errorf(at, "division by zero")
			}
			v /= r
		case '%':
			if r == 0 {
				return 0, p.errorf(at, "remainder of division by zero")
			}
			v = math.Mod(v, r)
		}
		if err := p.finite(v, at); err != nil {
			return 0, err
		}
	}
}

func (p *calcParser) unary() (float64, error) {
	switch p.peek() {
	case '-':
		p.pos++
		v, err := p.unary()
		return -v, err
	case '+':
		p.pos++
		return p.unary()
	}
	return p.power()
}

func (p *calcParser) power() (float64, error) {
	base, err := p.primary()
	if err != nil {
		return 0, err
	}
	if p.peek() != '^' {
		return base, nil
	}
	at := p.pos
	p.pos++
	exp, err := p.unary()
	if err != nil {
		return 0, err
	}
	if base == 0 && exp < 0 {
		return 0, p.errorf(at, "division by zero (zero to a negative power)")
	}
	v := math.Pow(base, exp)
	if err := p.finite(v, at); err != nil {
		return 0, err
	}
	return v, nil
}

func (p *calcParser) primary() (float64, error) {
	c := p.peek()
	switch {
	case c == 0:
		return 0, p.errorf(p.pos, "unexpected end of expression, expected a number or '('")
	case c == '(':
		open := p.pos
		p.pos++
		v, err := p.expr()
		if err != nil {
			return 0, err
		}
		if p.peek() != ')' {
			if p.pos >= len(p.src) {
				return 0, p.errorf(p.pos, "missing ')' to close the '(' at position %d", open+1)
			}
			return 0, p.errorf(p.pos, "expected ')' to close the '(' at position %d, found %q", open+1, p.src[p.pos])
		}
		p.pos++
		return v, nil
	case isDigit(c) || c == '.':
		return p.number()
	default:
		return 0, p.errorf(p.pos, "unexpected %q, expected a number or '('", c)
	}
}

func (p *calcParser) number() (float64, error) {
	start := p.pos
	digits := 0
	for p.pos < len(p.src) && isDigit(p.src[p.pos]) {
		p.pos++
		digits++
	}
	if p.pos < len(p.src) && p.src[p.pos] == '.' {
		p.pos++
		for p.pos < len(p.src) && isDigit(p.src[p.pos]) {
			p.pos++
			digits++
		}
	}
	if digits == 0 {
		return 0, p.errorf(start, "malformed number %q", string(p.src[start:p.pos]))
	}
	if p.pos < len(p.src) && p.src[p.pos] == '.' {
		return 0, p.errorf(p.pos, "malformed number: a second '.'")
	}
	v, err := strconv.ParseFloat(string(p.src[start:p.pos]), 64)
	if err != nil {
		return 0, p.errorf(start, "malformed number %q", string(p.src[start:p.pos]))
	}
	return v, nil
}

// finite rejects results JSON cannot carry.
func (p *calcParser) finite(v float64, at int) error {
	switch {
	case math.IsNaN(v):
		return p.errorf(at, "the result is not a real number")
	case math.IsInf(v, 0):
		return p.errorf(at, "the result is too large")
	}
	return nil
}

func isDigit(c rune) bool { return '0' <= c && c <= '9' }
