package recorder

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
)

// errWriterStopped is returned by a write after the writer has stopped.
var errWriterStopped = errors.New("recorder: writer stopped")

// batchWriter group-commits: handlers hand it their records and wait; it takes
// every record waiting (up to max) into one transaction, and answers each
// handler only after that transaction has committed, so that each message is
// acknowledged only once its effects are durable. When nothing else waits, a
// record is written alone at once: batching adds no latency.
//
// A batch that fails is retried record by record, so that one bad record fails
// alone and the others are not held back by it.
type batchWriter struct {
	store Store
	max   int
	log   *slog.Logger

	in      chan *writeReq // unbuffered: a record sent is a record the loop owns
	quit    chan struct{}
	done    chan struct{}
	started atomic.Bool
	once    sync.Once
}

type writeReq struct {
	rec Record
	err chan error // buffered: the loop never blocks on a handler gone away
}

func newBatchWriter(store Store, size int, log *slog.Logger) *batchWriter {
	return &batchWriter{store: store, max: size, log: log,
		in: make(chan *writeReq), quit: make(chan struct{}), done: make(chan struct{})}
}

// start runs the loop until stop. ctx's values (not its cancellation) are the
// base of every transaction's context.
func (w *batchWriter) start(ctx context.Context) {
	if w.started.CompareAndSwap(false, true) {
		go w.loop(context.WithoutCancel(ctx))
	}
}

// stop ends the loop once the batch in progress has been written; writes that
// were not taken yet fail with errWriterStopped. Call it after the consumers
// have drained, so that none is left. stop waits for the loop, bounded by ctx.
func (w *batchWriter) stop(ctx context.Context) error {
	w.once.Do(func() { close(w.quit) })
	if !w.started.Load() {
		return nil
	}
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// write hands rec to the loop and waits until it is committed or failed.
func (w *batchWriter) write(ctx context.Context, rec Record) error {
	req := &writeReq{rec: rec, err: make(chan error, 1)}
	select {
	case w.in <- req:
	case <-w.quit:
		return errWriterStopped
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-req.err:
		return err
	case <-ctx.Done():
		// The commit may still happen; the event is redelivered and then
		// found recorded.
		return ctx.Err()
	}
}

func (w *batchWriter) loop(ctx context.Context) {
	defer close(w.done)
	batch := make([]*writeReq, 0, w.max)
	for {
		select {
		case req := <-w.in:
			batch = append(batch[:0], req)
		case <-w.quit:
			return
		}
	fill:
		for len(batch) < w.max {
			select {
			case req := <-w.in:
				batch = append(batch, req)
			default:
				break fill
			}
		}
		w.flush(ctx, batch)
		clear(batch) // drop references to the records written
	}
}

func (w *batchWriter) flush(ctx context.Context, batch []*writeReq) {
	// One order for every batch (by run, then call) makes two replicas'
	// transactions take row locks in the same order, so they rarely deadlock;
	// the stores' rules make the result independent of the order.
	slices.SortStableFunc(batch, func(a, b *writeReq) int {
		return cmp.Or(cmp.Compare(a.rec.Event.RunID, b.rec.Event.RunID),
			cmp.Compare(a.rec.Event.CallID, b.rec.Event.CallID))
	})
	recs := make([]Record, len(batch))
	for i, req := range batch {
		recs[i] = req.rec
	}
	err := w.writeOnce(ctx, recs...)
	if err == nil || len(batch) == 1 {
		for _, req := range batch {
			req.err <- err
		}
		return
	}
	w.log.Warn("batch failed; writing its events one by one", "events", len(batch), "err", err)
	for _, req := range batch {
		req.err <- w.writeOnce(ctx, req.rec)
	}
}

func (w *batchWriter) writeOnce(ctx context.Context, recs ...Record) error {
	ctx, cancel := context.WithTimeout(ctx, defaultWriteTimeout)
	defer cancel()
	return w.store.Write(ctx, recs...)
}
