package kvwatch

import (
	"context"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// KVWatch follows every key of a KeyValue bucket: the registry's catalog,
// the guard's approval deadlines and the orchestrator's approvals all keep
// their view of a bucket with one. Stop ends it.
type KVWatch struct {
	w      jetstream.KeyWatcher
	cancel context.CancelFunc
	done   chan struct{}
	stop   sync.Once
}

// WatchKV starts following kv. apply is called on one goroutine, in order, for
// every entry there is and every change after it (puts, deletes and purges;
// see jetstream.KeyValueEntry.Operation). When waitInitial is set, WatchKV
// returns once apply has seen the values the bucket held at the start.
//
// ctx bounds the start only (the wait for the initial values): the watch
// itself follows the bucket until Stop, so that a watch started with a
// service's start-up context does not end with it.
func WatchKV(ctx context.Context, kv jetstream.KeyValue, waitInitial bool, apply func(jetstream.KeyValueEntry)) (*KVWatch, error) {
	// A nats.go watcher unsubscribes when its context ends: it gets one that
	// only Stop ends.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w, err := kv.WatchAll(wctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("watch %s: %w", kv.Bucket(), err)
	}
	kw := &KVWatch{w: w, cancel: cancel, done: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		defer close(kw.done)
		readyOnce := sync.OnceFunc(func() { close(ready) })
		defer readyOnce()
		for e := range w.Updates() {
			if e == nil { // the end of the initial values
				readyOnce()
				continue
			}
			apply(e)
		}
	}()
	if !waitInitial {
		return kw, nil
	}
	select {
	case <-ready:
		return kw, nil
	case <-ctx.Done():
		kw.Stop()
		return nil, fmt.Errorf("watch %s: %w", kv.Bucket(), context.Cause(ctx))
	}
}

// Stop ends the watch and waits until apply has returned for the last time.
// It is idempotent.
func (kw *KVWatch) Stop() {
	kw.stop.Do(func() {
		_ = kw.w.Stop()
		kw.cancel()
		<-kw.done
	})
}
