package service_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/service"
)

// svc is the smallest service: a lifecycle, a watch-like goroutine on the
// lifetime context and a release registered at start.
type svc struct {
	service.Lifecycle
	released []string
	failAt   string
	life     context.Context
}

func (s *svc) Start(ctx context.Context) (err error) {
	life, err := s.Starting(ctx)
	if err != nil {
		return err
	}
	defer func() { err = s.Started(ctx, err) }()
	s.life = life
	s.OnStopFunc(func() { s.released = append(s.released, "watch") })
	if s.failAt == "consumer" {
		return errors.New("consumer refused")
	}
	s.OnStop(func(context.Context) error { s.released = append(s.released, "consumer"); return nil })
	return nil
}

func TestLifecycleRules(t *testing.T) {
	ctx := t.Context()
	s := &svc{}
	require.False(t, s.Running())
	require.NoError(t, s.Start(ctx))
	require.True(t, s.Running())
	require.ErrorIs(t, s.Start(ctx), service.ErrAlreadyStarted)
	require.NoError(t, s.Stop(ctx))
	require.Equal(t, []string{"consumer", "watch"}, s.released, "released in reverse order of setup")
	require.ErrorIs(t, s.life.Err(), context.Canceled, "Stop ends the lifetime context")
	require.NoError(t, s.Stop(ctx), "Stop is idempotent")
	require.Equal(t, []string{"consumer", "watch"}, s.released, "a second Stop releases nothing again")
	require.ErrorIs(t, s.Start(ctx), service.ErrStopped)
	require.NoError(t, s.Wait(ctx))

	s = &svc{}
	require.NoError(t, s.Stop(ctx), "Stop before Start")
	require.ErrorIs(t, s.Start(ctx), service.ErrStopped)

	s = &svc{failAt: "consumer"}
	require.EqualError(t, s.Start(ctx), "consumer refused")
	require.Equal(t, []string{"watch"}, s.released, "a failed start releases what it set up")
	require.ErrorIs(t, s.life.Err(), context.Canceled)
	require.ErrorIs(t, s.Start(ctx), service.ErrStopped, "a failed service stays stopped")
	select {
	case <-s.Done():
	default:
		t.Fatal("a failed start leaves the service stopped")
	}
}

// The lifetime context outlives the start-up context: a start with a deadline
// (service.Run gives 60 s) or one cancelled right after Start leaves the
// service's watches running.
func TestLifecycleOutlivesStartContext(t *testing.T) {
	type key struct{}
	startCtx, cancel := context.WithTimeout(context.WithValue(t.Context(), key{}, "v"), time.Hour)
	s := &svc{}
	require.NoError(t, s.Start(startCtx))
	cancel()
	require.NoError(t, s.life.Err(), "the start context ended, the service's life goes on")
	_, hasDeadline := s.life.Deadline()
	require.False(t, hasDeadline)
	require.Equal(t, "v", s.life.Value(key{}), "values carry over")
	require.NoError(t, s.Stop(t.Context()))
	require.Error(t, s.life.Err())
}

func TestLifecycleGoAndStopErrors(t *testing.T) {
	var l service.Lifecycle
	life, err := l.Starting(t.Context())
	require.NoError(t, err)
	ended := make(chan struct{})
	l.Go(life, func(ctx context.Context) {
		<-ctx.Done()
		close(ended)
	})
	l.OnStop(func(context.Context) error { return errors.New("drain failed") })
	require.NoError(t, l.Started(t.Context(), nil))
	err = l.Stop(t.Context())
	require.EqualError(t, err, "drain failed")
	<-ended
	require.EqualError(t, l.Stop(t.Context()), "drain failed", "every Stop returns the first one's error")
	require.EqualError(t, l.Wait(t.Context()), "drain failed")

	// A goroutine that ignores its context is reported, bounded by Stop's.
	var l2 service.Lifecycle
	life2, err := l2.Starting(t.Context())
	require.NoError(t, err)
	release := make(chan struct{})
	l2.Go(life2, func(context.Context) { <-release })
	require.NoError(t, l2.Started(t.Context(), nil))
	sctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	require.ErrorContains(t, l2.Stop(sctx), "stopped before its goroutines returned")
	close(release)
}

// Stop and Start may race: Stop waits for a Start in progress, and exactly one
// outcome holds.
func TestLifecycleConcurrentStopStart(t *testing.T) {
	for range 50 {
		s := &svc{}
		var wg sync.WaitGroup
		var startErr error
		wg.Go(func() { startErr = s.Start(t.Context()) })
		wg.Go(func() { require.NoError(t, s.Stop(t.Context())) })
		wg.Wait()
		if startErr == nil {
			require.Equal(t, []string{"consumer", "watch"}, s.released, "a Start that won is stopped in full")
		} else {
			require.ErrorIs(t, startErr, service.ErrStopped)
			require.Empty(t, s.released)
		}
	}
}
