package api

import (
	"sync"

	"github.com/toolwire/toolwire/services/recorder/store"
)

// Changes tells live readers that events of a run were just committed, so
// that a live stream sends them at once instead of at its next poll. It only
// sees this process's commits: a stream also polls, for what other replicas
// record.
type Changes struct {
	mu   sync.Mutex
	subs map[string]map[chan struct{}]struct{}
}

// NewChanges returns an empty hub.
func NewChanges() *Changes { return &Changes{subs: map[string]map[chan struct{}]struct{}{}} }

// Subscribe returns a channel that receives (coalesced) a signal after each
// commit touching runID, and a function that ends the subscription.
func (c *Changes) Subscribe(runID string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	c.mu.Lock()
	if c.subs[runID] == nil {
		c.subs[runID] = map[chan struct{}]struct{}{}
	}
	c.subs[runID][ch] = struct{}{}
	c.mu.Unlock()
	return ch, func() {
		c.mu.Lock()
		delete(c.subs[runID], ch)
		if len(c.subs[runID]) == 0 {
			delete(c.subs, runID)
		}
		c.mu.Unlock()
	}
}

// Notify signals the subscribers of the runs of recs, just committed.
func (c *Changes) Notify(recs []store.Record) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.subs) == 0 {
		return
	}
	for i := range recs {
		for ch := range c.subs[recs[i].Event.RunID] {
			select {
			case ch <- struct{}{}:
			default: // a signal is pending already
			}
		}
	}
}
