package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Errors of a Lifecycle.
var (
	// ErrAlreadyStarted is returned by a second Start.
	ErrAlreadyStarted = errors.New("service: already started")
	// ErrStopped is returned by Start after Stop (or after a failed Start):
	// a stopped service cannot start again; build a new one.
	ErrStopped = errors.New("service: stopped")
)

type lifeState int

const (
	idle lifeState = iota
	running
	stopped
)

// Lifecycle is the start/stop state machine every service embeds, in its
// Core (the shape of river's BaseStartStop). A service's Start begins with
// Starting, which hands out the service's lifetime context, and ends with
// Started (Core.StartWith does both); everything Start sets up that must be
// released registers an OnStop function. Stop runs them in reverse order,
// then ends the lifetime context.
//
//	func (s *Service) Start(ctx context.Context) error {
//		return s.StartWith(ctx, func(ctx, life context.Context) error {
//			// ctx bounds the start-up I/O; life outlives it until Stop.
//			...
//			s.OnStop(runner.Stop)
//		})
//	}
//
// The rules it enforces, once for every service:
//   - A second Start is ErrAlreadyStarted; a Start after Stop is ErrStopped.
//   - A Start that fails releases what it had set up (its OnStop functions)
//     and leaves the service stopped.
//   - Stop is idempotent and safe before Start; a Stop that comes while Start
//     runs waits for it. Every Stop returns the first one's error.
//   - A long-lived watch or consumer hangs off the lifetime context, never off
//     the start-up one: the lifetime context keeps ctx's values but not its
//     deadline or cancellation.
//
// The zero value is ready to use; a Lifecycle must not be copied.
type Lifecycle struct {
	startMu sync.Mutex // held from Starting to Started

	mu      sync.Mutex
	state   lifeState
	cancel  context.CancelFunc
	onStop  []func(context.Context) error
	done    chan struct{}
	stopErr error
	stopMu  sync.Mutex     // serializes Stop
	tasks   sync.WaitGroup // the goroutines started by Go
}

// Starting begins a Start: it returns the lifetime context (ctx's values,
// ended by Stop), or ErrAlreadyStarted or ErrStopped. After a nil error the
// caller must call Started.
func (l *Lifecycle) Starting(ctx context.Context) (context.Context, error) {
	l.startMu.Lock()
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.state == stopped:
		l.startMu.Unlock()
		return nil, ErrStopped
	case l.cancel != nil:
		l.startMu.Unlock()
		return nil, ErrAlreadyStarted
	}
	life, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l.cancel = cancel
	return life, nil
}

// Started ends a Start and returns err. With a nil err the service is
// running. With an error, what Start had registered is released (bounded by
// ctx's values, not its deadline: a start that failed because its deadline
// passed must still release) and the service is stopped.
func (l *Lifecycle) Started(ctx context.Context, err error) error {
	defer l.startMu.Unlock()
	if err == nil {
		l.mu.Lock()
		l.state = running
		l.mu.Unlock()
		return nil
	}
	return errors.Join(err, l.stop(context.WithoutCancel(ctx)))
}

// OnStop registers fn to run at Stop, after the functions registered later
// (reverse order: a consumer registered after the watch it reads stops first).
func (l *Lifecycle) OnStop(fn func(context.Context) error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.onStop = append(l.onStop, fn)
}

// OnStopFunc registers a release that cannot fail (see OnStop).
func (l *Lifecycle) OnStopFunc(fn func()) {
	l.OnStop(func(context.Context) error { fn(); return nil })
}

// Go runs fn on a goroutine the service owns: fn gets life (the context
// Starting returned) and must return when it ends. Stop ends life after its
// OnStop functions and waits, bounded by its ctx, for every such fn.
func (l *Lifecycle) Go(life context.Context, fn func(context.Context)) {
	l.tasks.Go(func() { fn(life) })
}

// Stop stops the service: it runs the OnStop functions in reverse order,
// bounded by ctx, then ends the lifetime context and waits for the goroutines
// started by Go. It is idempotent: later calls wait for the first and return
// its error.
func (l *Lifecycle) Stop(ctx context.Context) error {
	l.startMu.Lock() // a Start in progress finishes first
	defer l.startMu.Unlock()
	return l.stop(ctx)
}

func (l *Lifecycle) stop(ctx context.Context) error {
	l.stopMu.Lock()
	defer l.stopMu.Unlock()
	l.mu.Lock()
	if l.state == stopped && l.onStop == nil && l.cancel == nil {
		err := l.stopErr
		l.mu.Unlock()
		return err
	}
	l.state = stopped
	fns, cancel := l.onStop, l.cancel
	l.onStop, l.cancel = nil, nil
	l.mu.Unlock()

	var errs []error
	for i := len(fns) - 1; i >= 0; i-- {
		if err := fns[i](ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if cancel != nil {
		cancel()
	}
	tasksDone := make(chan struct{})
	go func() {
		l.tasks.Wait()
		close(tasksDone)
	}()
	select {
	case <-tasksDone:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("service: stopped before its goroutines returned: %w", context.Cause(ctx)))
	}
	l.mu.Lock()
	l.stopErr = errors.Join(errs...)
	l.closeDone()
	err := l.stopErr
	l.mu.Unlock()
	return err
}

// closeDone closes the done channel; the caller holds l.mu.
func (l *Lifecycle) closeDone() {
	if l.done == nil {
		l.done = make(chan struct{})
	}
	select {
	case <-l.done:
	default:
		close(l.done)
	}
}

// Done returns a channel closed once the service has stopped.
func (l *Lifecycle) Done() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done == nil {
		l.done = make(chan struct{})
	}
	return l.done
}

// Wait blocks until the service has stopped, and returns Stop's error; or
// ctx's error if ctx ends first.
func (l *Lifecycle) Wait(ctx context.Context) error {
	select {
	case <-l.Done():
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.stopErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Running reports whether the service has started and not stopped.
func (l *Lifecycle) Running() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state == running
}
