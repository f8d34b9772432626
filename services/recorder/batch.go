package recorder

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/toolwire/toolwire/services/recorder/store"
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
//
// When the database is unreachable (a write fails and a ping fails too), the
// writer holds the batch and waits until the database answers, then writes it
// again: its handlers keep waiting (their messages kept in progress, never
// redelivered), the consumers' handler pools fill up and they stop pulling.
// Once the database is back everything held commits and the consumers catch up
// from where they stopped: nothing is dead-lettered for an outage, and writes
// keyed by event id make a batch whose commit did happen before the connection
// broke harmless to write again.
type batchWriter struct {
	store store.Store
	max   int
	log   *slog.Logger
	// ping checks that the database answers; nil: outages are not detected
	// and failed writes return their error.
	ping func(context.Context) error
	// onCommit is called after each commit with its records.
	onCommit func([]store.Record)
	// onState is called when the database goes down (false) and comes back.
	onState func(up bool)
	down    atomic.Bool
	// tracer and kind make each transaction a span (startWrite); nil: none.
	tracer trace.Tracer
	kind   string

	// writers is how many transactions may be in progress at once (each
	// loop writes one); default 1. See Service's use.
	writers int

	in      chan []*writeReq // unbuffered: records sent are records a loop owns
	quit    chan struct{}
	done    chan struct{} // closed once every loop has returned
	started atomic.Bool
	once    sync.Once
}

type writeReq struct {
	rec store.Record
	err chan error // buffered: the loop never blocks on a handler gone away
}

func newBatchWriter(st store.Store, size int, log *slog.Logger) *batchWriter {
	return &batchWriter{store: st, max: size, log: log,
		in: make(chan []*writeReq), quit: make(chan struct{}), done: make(chan struct{})}
}

// start runs the loops until stop. ctx is the base of every transaction's
// context: the recorder's lifetime, which ends only after stop, so that a
// write still in progress when a bounded stop gave up is cancelled rather
// than left running.
func (w *batchWriter) start(ctx context.Context) {
	if !w.started.CompareAndSwap(false, true) {
		return
	}
	var wg sync.WaitGroup
	for range max(w.writers, 1) {
		wg.Go(func() { w.loop(ctx) })
	}
	go func() { wg.Wait(); close(w.done) }()
}

// stop ends the loops once their batches in progress have been written;
// writes that were not taken yet fail with errWriterStopped. Call it after the
// consumers have drained, so that none is left. stop waits for the loops,
// bounded by ctx.
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
func (w *batchWriter) write(ctx context.Context, rec store.Record) error {
	req := &writeReq{rec: rec, err: make(chan error, 1)}
	select {
	case w.in <- []*writeReq{req}:
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

// writeAll hands recs to the loop at once and waits until each is committed
// or failed; errs[i] is recs[i]'s outcome. The loop writes them in
// transactions of at most max records, beside other handlers' records.
func (w *batchWriter) writeAll(ctx context.Context, recs []store.Record) []error {
	errs := make([]error, len(recs))
	if len(recs) == 0 {
		return errs
	}
	reqs := make([]*writeReq, len(recs))
	for i := range recs {
		reqs[i] = &writeReq{rec: recs[i], err: make(chan error, 1)}
	}
	select {
	case w.in <- reqs:
	case <-w.quit:
		return slices.Repeat([]error{errWriterStopped}, len(recs))
	case <-ctx.Done():
		return slices.Repeat([]error{ctx.Err()}, len(recs))
	}
	for i, req := range reqs {
		select {
		case errs[i] = <-req.err:
		case <-ctx.Done():
			errs[i] = ctx.Err() // the commit may still happen; see write
		}
	}
	return errs
}

func (w *batchWriter) loop(ctx context.Context) {
	var batch []*writeReq
	for {
		select {
		case reqs := <-w.in:
			batch = append(batch[:0], reqs...)
		case <-w.quit:
			return
		}
	fill:
		for len(batch) < w.max {
			select {
			case reqs := <-w.in:
				batch = append(batch, reqs...)
			default:
				break fill
			}
		}
		for rest := batch; len(rest) > 0; {
			n := min(len(rest), w.max)
			w.flush(ctx, rest[:n])
			rest = rest[n:]
		}
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
	recs := make([]store.Record, len(batch))
	for i, req := range batch {
		recs[i] = req.rec
	}
	err := w.writeHeld(ctx, recs...)
	if err == nil || len(batch) == 1 || errors.Is(err, errWriterStopped) {
		for _, req := range batch {
			req.err <- err
		}
		return
	}
	w.log.Warn("batch failed; writing its events one by one", "events", len(batch), "err", err)
	for _, req := range batch {
		req.err <- w.writeHeld(ctx, req.rec)
	}
}

// writeHeld writes recs; while the database is unreachable it waits for it
// and writes them again. It returns errWriterStopped when the writer stops
// during an outage.
func (w *batchWriter) writeHeld(ctx context.Context, recs ...store.Record) error {
	for {
		err := w.writeOnce(ctx, recs...)
		if err == nil {
			if w.onCommit != nil {
				w.onCommit(recs)
			}
			return nil
		}
		if errors.Is(err, store.ErrUnstorable) || w.ping == nil || w.reachable(ctx) {
			return err
		}
		w.setDown(true, len(recs), err)
		if !w.waitReachable(ctx) {
			return errWriterStopped
		}
		w.setDown(false, len(recs), nil)
	}
}

func (w *batchWriter) reachable(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return w.ping(ctx) == nil
}

// waitReachable pings the database with back-off until it answers (true) or
// the writer stops (false).
func (w *batchWriter) waitReachable(ctx context.Context) bool {
	delay := 50 * time.Millisecond
	for {
		t := time.NewTimer(delay)
		select {
		case <-w.quit:
			t.Stop()
			return false
		case <-t.C:
		}
		if w.reachable(ctx) {
			return true
		}
		delay = min(delay*2, 2*time.Second)
	}
}

func (w *batchWriter) setDown(down bool, held int, err error) {
	if w.down.Swap(down) == down {
		return
	}
	if down {
		w.log.Error("database unreachable: holding events until it answers; consumers pause", "held", held, "err", err)
	} else {
		w.log.Warn("database reachable again: writing held events; consumers resume", "held", held)
	}
	if w.onState != nil {
		w.onState(!down)
	}
}

// holding reports whether the writer is waiting for the database.
func (w *batchWriter) holding() bool { return w.down.Load() }

func (w *batchWriter) writeOnce(ctx context.Context, recs ...store.Record) (err error) {
	ctx, cancel := context.WithTimeout(ctx, store.DefaultWriteTimeout)
	defer cancel()
	ctx, end := startWrite(ctx, w.tracer, w.kind, recs)
	defer func() { end(err) }()
	return w.store.Write(ctx, recs...)
}
