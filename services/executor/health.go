package executor

import (
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
)

// Circuit states as ToolHealth reports them.
const (
	CircuitClosed   = "closed"
	CircuitOpen     = "open"
	CircuitHalfOpen = "half_open"
)

// halfOpenRetryAfter is the retry hint of a call refused while a half-open
// circuit's trial call runs.
const halfOpenRetryAfter = time.Second

// ToolHealth is one tool version's health as seen by this replica.
type ToolHealth struct {
	// Tool is name@version.
	Tool string `json:"tool"`
	// State is closed (calls go through), open (calls fail at once with
	// PROVIDER_ERROR until OpenUntil) or half_open (one trial call decides).
	State string `json:"state"`
	// ConsecutiveFailures counts the PROVIDER_ERROR, NETWORK_ERROR and TIMEOUT
	// outcomes since the last success.
	ConsecutiveFailures uint32 `json:"consecutive_failures"`
	// OpenUntil is when an open circuit lets a trial call through.
	OpenUntil time.Time `json:"open_until,omitzero"`
	// LastFailure is the code of the latest failure, if any.
	LastFailure envelope.ErrorCode `json:"last_failure,omitempty"`
	// LastFailureAt is when it happened.
	LastFailureAt time.Time `json:"last_failure_at,omitzero"`
}

// errNotAHealthOutcome marks a call outcome that says nothing about the
// tool's health (the circuit neither counts it as a failure nor as a success).
var errNotAHealthOutcome = errors.New("not a health outcome")

// circuits holds a circuit breaker per tool version (docs/tools.md, Tool
// health), keyed by its metrics label, name@version.
// Consecutive failures open the circuit for a while; then one trial call
// decides whether it closes again. Each replica keeps its own.
type circuits struct {
	failures int
	open     time.Duration
	now      func() time.Time
	metrics  *metrics
	opened   func() // called when a circuit opens (a beat announces it); nil: none

	mu       sync.Mutex
	breakers map[string]*circuit
}

type circuit struct {
	cb *gobreaker.TwoStepCircuitBreaker[struct{}]

	mu            sync.Mutex
	openUntil     time.Time
	consecutive   uint32
	lastFailure   envelope.ErrorCode
	lastFailureAt time.Time
}

func newCircuits(failures int, open time.Duration, now func() time.Time, m *metrics) *circuits {
	return &circuits{failures: failures, open: open, now: now, metrics: m, breakers: map[string]*circuit{}}
}

func (cs *circuits) get(tool string) *circuit {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if c, ok := cs.breakers[tool]; ok {
		return c
	}
	c := &circuit{}
	threshold := uint32(cs.failures) //nolint:gosec // Config.Validate bounds it to 1..1000
	c.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        tool,
		MaxRequests: 1,
		Timeout:     cs.open,
		ReadyToTrip: func(counts gobreaker.Counts) bool { return counts.ConsecutiveFailures >= threshold },
		IsExcluded:  func(err error) bool { return errors.Is(err, errNotAHealthOutcome) },
		OnStateChange: func(name string, _, to gobreaker.State) {
			c.mu.Lock()
			if to == gobreaker.StateOpen {
				c.openUntil = cs.now().Add(cs.open)
				if f := cs.openedFunc(); f != nil {
					defer f()
				}
			} else {
				c.openUntil = time.Time{}
			}
			c.mu.Unlock()
			cs.metrics.circuit.WithLabelValues(name).Set(stateValue(to))
		},
	})
	cs.breakers[tool] = c
	cs.metrics.circuit.WithLabelValues(tool).Set(0)
	return c
}

// onOpen has f called (quickly, without blocking) whenever a circuit opens.
func (cs *circuits) onOpen(f func()) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.opened = f
}

func (cs *circuits) openedFunc() func() {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.opened
}

// peerRefusal is the PROVIDER_ERROR of a call of tool while another live
// executor's circuit for it is open: every replica fails fast on what one
// has found out, until that circuit lets a trial call through.
func (s *Service) peerRefusal(tool string) *envelope.ToolError {
	if s.peers == nil {
		return nil
	}
	h, by, open := s.peers.OpenElsewhere(tool, s.instance)
	if !open {
		return nil
	}
	wait := h.OpenUntil.Sub(s.now())
	te := envelope.NewToolError(envelope.CodeProviderError,
		"tool %s is unavailable: executor %s's circuit is open after %d consecutive failures (last: %s); retry in %s",
		tool, by.ID, h.ConsecutiveFailures, h.LastFailure, wait.Round(time.Millisecond))
	te.RetryAfterS = retryAfterSeconds(wait)
	return te
}

func stateValue(s gobreaker.State) float64 {
	switch s {
	case gobreaker.StateHalfOpen:
		return 1
	case gobreaker.StateOpen:
		return 2
	}
	return 0
}

// allow asks whether a call of tool may run. It returns done, to be called
// exactly once with the call's outcome, or the PROVIDER_ERROR to answer at
// once.
func (cs *circuits) allow(tool string) (done func(code envelope.ErrorCode, ran bool), refusal *envelope.ToolError) {
	c := cs.get(tool)
	report, err := c.cb.Allow()
	if err != nil {
		cs.metrics.circuitFast.WithLabelValues(tool).Inc()
		c.mu.Lock()
		wait, last := c.openUntil.Sub(cs.now()), c.lastFailure
		c.mu.Unlock()
		if errors.Is(err, gobreaker.ErrTooManyRequests) || wait <= 0 {
			wait = halfOpenRetryAfter
		}
		te := envelope.NewToolError(envelope.CodeProviderError,
			"tool %s is unavailable: its circuit is open after %d consecutive failures (last: %s); retry in %s",
			tool, cs.failures, last, wait.Round(time.Millisecond))
		te.RetryAfterS = retryAfterSeconds(wait)
		return nil, te
	}
	var once sync.Once
	return func(code envelope.ErrorCode, ran bool) {
		once.Do(func() {
			switch {
			case !ran:
				report(errNotAHealthOutcome)
			case code == envelope.CodeProviderError || code == envelope.CodeNetworkError || code == envelope.CodeTimeout:
				c.mu.Lock()
				c.lastFailure, c.lastFailureAt = code, cs.now().UTC()
				c.consecutive++
				c.mu.Unlock()
				report(errors.New(string(code)))
			case code == envelope.CodeUnknown || code == envelope.CodeRateLimit:
				// A crash of ours or a provider asking to slow down: not a
				// sign that the tool is down.
				report(errNotAHealthOutcome)
			default:
				c.mu.Lock()
				c.consecutive = 0
				c.mu.Unlock()
				report(nil)
			}
		})
	}, nil
}

// snapshot returns the health of every tool version called so far, sorted.
func (cs *circuits) snapshot() []ToolHealth {
	cs.mu.Lock()
	names := make([]string, 0, len(cs.breakers))
	for n := range cs.breakers {
		names = append(names, n)
	}
	cs.mu.Unlock()
	sort.Strings(names)
	out := make([]ToolHealth, 0, len(names))
	for _, n := range names {
		c := cs.get(n)
		state := c.cb.State() // may move open to half-open
		c.mu.Lock()
		h := ToolHealth{
			Tool: n, ConsecutiveFailures: c.consecutive,
			LastFailure: c.lastFailure, LastFailureAt: c.lastFailureAt,
		}
		switch state {
		case gobreaker.StateOpen:
			h.State, h.OpenUntil = CircuitOpen, c.openUntil.UTC()
		case gobreaker.StateHalfOpen:
			h.State = CircuitHalfOpen
		default:
			h.State = CircuitClosed
		}
		c.mu.Unlock()
		out = append(out, h)
	}
	return out
}

// unwell is what a heartbeat says of this replica's circuits: those open,
// half open or counting failures, at most registry.MaxWorkerTools (the
// open ones first).
func (s *Service) unwell() []registry.ToolHealth {
	var out []registry.ToolHealth
	for _, h := range s.circuits.snapshot() {
		if h.State == CircuitClosed && h.ConsecutiveFailures == 0 {
			continue
		}
		out = append(out, registry.ToolHealth{Tool: h.Tool, State: h.State, ConsecutiveFailures: h.ConsecutiveFailures,
			OpenUntil: h.OpenUntil, LastFailure: string(h.LastFailure)})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].State == CircuitOpen && out[j].State != CircuitOpen })
	return out[:min(len(out), registry.MaxWorkerTools)]
}

// Health returns the health of every tool version this replica has called:
// its circuit's state, consecutive failures and latest failure. The catalog
// shows it beside each tool.
func (s *Service) Health() []ToolHealth { return s.circuits.snapshot() }
