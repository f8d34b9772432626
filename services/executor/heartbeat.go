package executor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/toolwire/toolwire/pkg/jetstream/registry"
)

// heartbeats announce the queues this process serves (registry.Beat): one
// beat per queue at Start, before the executor counts as started, then one
// per queue every Config.Heartbeat, each holding for three of them. Stop
// ends them and removes the beats, so that the Policy Guard stops routing
// calls here at once; a process that dies drops out when its beats expire.
type heartbeats struct {
	s       *Service
	workers []registry.Worker
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
	// kicks asks for a beat now (a circuit opened), at most one pending.
	kicks chan struct{}
}

// kick asks for a beat now, without waiting: a beat pending already
// covers it, so a storm of openings is one beat.
func (h *heartbeats) kick() {
	select {
	case h.kicks <- struct{}{}:
	default:
	}
}

// startHeartbeats beats every queue once (ctx bounds it), then keeps
// beating on life until stop.
func (s *Service) startHeartbeats(ctx, life context.Context) (*heartbeats, error) {
	nonce := make([]byte, 8)
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("heartbeat instance: %w", err)
	}
	instance := hex.EncodeToString(nonce)
	s.instance = instance
	tools := make([]string, 0, min(len(s.defs), registry.MaxWorkerTools))
	for i := range s.defs {
		if len(tools) == registry.MaxWorkerTools {
			break
		}
		tools = append(tools, s.defs[i].Ref().String())
	}
	h := &heartbeats{s: s, stop: make(chan struct{}), done: make(chan struct{}), kicks: make(chan struct{}, 1)}
	started := s.now().UTC()
	for _, q := range s.cfg.Queues {
		h.workers = append(h.workers, registry.Worker{Queue: q, Instance: instance, ID: s.cfg.ID, Tools: tools,
			StartedAt: started, TTL: heartbeatTTLs * s.cfg.Heartbeat})
	}
	if err := h.beat(ctx); err != nil {
		return nil, err
	}
	go h.run(life)
	return h, nil
}

// beat sends one beat per queue.
func (h *heartbeats) beat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, h.s.cfg.Heartbeat)
	defer cancel()
	health := h.s.unwell()
	for _, w := range h.workers {
		w.Health = health
		if err := registry.Beat(ctx, h.s.JS, w, h.s.now()); err != nil {
			h.s.metrics.heartbeatFailures.Inc()
			return err
		}
	}
	return nil
}

func (h *heartbeats) run(life context.Context) {
	defer close(h.done)
	t := time.NewTicker(h.s.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-life.Done():
			return
		case <-t.C:
		case <-h.kicks:
		}
		if err := h.beat(life); err != nil {
			// The next beat may get through: a beat outlives two lost ones.
			h.s.Log.Warn("heartbeat failed", "err", err)
		}
	}
}

// every calls beat once a period until stop is closed, ctx ends or beat
// returns false: the loop of the queues' heartbeats and of a claim's.
func every(ctx context.Context, stop <-chan struct{}, period time.Duration, beat func() bool) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
			if !beat() {
				return
			}
		}
	}
}

// end stops the beats and removes them, within ctx. A beat it cannot remove
// (NATS is gone) expires by itself within its TTL: that is logged, not a
// failure of Stop. It is idempotent.
func (h *heartbeats) end(ctx context.Context) error {
	h.once.Do(func() {
		close(h.stop)
		<-h.done
		for _, w := range h.workers {
			if err := registry.Leave(ctx, h.s.JS, w.Queue, w.Instance); err != nil {
				h.s.Log.Warn("could not withdraw the heartbeat of a queue; it expires by itself",
					"queue", w.Queue, "ttl", w.TTL, "err", err)
			}
		}
	})
	return nil
}
