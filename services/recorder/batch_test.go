package recorder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/postgres"
	"github.com/toolwire/toolwire/services/recorder/store/postgres/pgtest"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// TestBatchWriterIsolatesABadRecord writes many records at once, one of which
// Postgres refuses: that one fails as ErrUnstorable, every other one commits,
// whatever batches the writer formed.
func TestBatchWriterIsolatesABadRecord(t *testing.T) {
	dsn := pgtest.Schema(t)
	pool, err := postgres.NewPool(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	if _, err := postgres.Migrate(ctx, pool, log); err != nil {
		t.Fatal(err)
	}
	st := postgres.New(pool)
	w := newBatchWriter(st, 16, log)
	w.start(ctx)

	const n, bad = 64, 17
	// The runs are requested first: a run's other events apply once it is.
	for i := range n {
		fx := storetest.StartedRun(t, fmt.Sprintf("batch-%02d", i), "batch", envelope.Tenant{OrgID: "o"}, time.Now())
		if err := st.Write(ctx, storetest.Records(t, fx.Events[0])...); err != nil {
			t.Fatal(err)
		}
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		reason := ""
		if i == bad {
			reason = "nul \u0000"
		}
		o, err := events.NewRunStatus("/test", events.RunStatus{RunID: fmt.Sprintf("batch-%02d", i),
			Status: events.StatusFailed, Tenant: envelope.Tenant{OrgID: "o"}, Reason: reason}, "", events.RunTrace{})
		if err != nil {
			t.Fatal(err)
		}
		rec, err := store.RecordOf(&o.Event, o.Subject)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { errs[i] = w.write(ctx, rec) })
	}
	wg.Wait()
	if err := w.stop(ctx); err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if i == bad {
			if !errors.Is(err, store.ErrUnstorable) {
				t.Errorf("record %d: %v, want ErrUnstorable", i, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("record %d: %v", i, err)
		}
	}
	runs, err := st.ListRuns(ctx, store.RunFilter{Limit: store.MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	failed := 0
	for _, r := range runs {
		if r.Status == events.StatusFailed {
			failed++
		}
	}
	if len(runs) != n || failed != n-1 {
		t.Fatalf("%d runs, %d failed, want %d runs, %d failed", len(runs), failed, n, n-1)
	}
	if err := w.write(ctx, store.Record{}); !errors.Is(err, errWriterStopped) {
		t.Fatalf("write after stop: %v", err)
	}
}

// overlapStore is a store whose writes wait, for a while, for another write
// to be in progress, and count how many ever were at once.
type overlapStore struct {
	store.Store
	mu       sync.Mutex
	inFlight int
	most     int
	closed   bool
	another  chan struct{}
}

func (s *overlapStore) Write(ctx context.Context, _ ...store.Record) error {
	s.mu.Lock()
	s.inFlight++
	s.most = max(s.most, s.inFlight)
	if s.inFlight == 2 && s.most == 2 && !s.closed {
		s.closed = true
		close(s.another)
	}
	s.mu.Unlock()
	select {
	case <-s.another:
	case <-time.After(300 * time.Millisecond):
	case <-ctx.Done():
	}
	s.mu.Lock()
	s.inFlight--
	s.mu.Unlock()
	return nil
}

// The writer keeps as many transactions in progress as it has writers, and
// never more: the records of one handler go to one of them, and every record
// is answered.
func TestBatchWriterWritesInParallelUpToItsWriters(t *testing.T) {
	for _, writers := range []int{1, 2} {
		t.Run(fmt.Sprintf("writers=%d", writers), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			st := &overlapStore{another: make(chan struct{})}
			w := newBatchWriter(st, 1, slog.New(slog.DiscardHandler))
			w.writers = writers
			w.start(ctx)
			var wg sync.WaitGroup
			errs := make([]error, 4)
			for i := range errs {
				wg.Go(func() { errs[i] = w.write(ctx, store.Record{}) })
			}
			wg.Wait()
			if err := w.stop(ctx); err != nil {
				t.Fatal(err)
			}
			for i, err := range errs {
				if err != nil {
					t.Errorf("record %d: %v", i, err)
				}
			}
			if st.most != writers {
				t.Errorf("%d writes at once at most, want %d", st.most, writers)
			}
		})
	}
}
