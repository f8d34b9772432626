package api_test

import (
	"net/url"
	"slices"
	"testing"

	"github.com/toolwire/toolwire/services/recorder/api"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// FuzzRunFilter: whatever the query string, the runs filter is refused with
// an error or holds only valid values.
func FuzzRunFilter(f *testing.F) {
	for _, seed := range []string{"", "status=completed&agent=a&tenant=o/w/u", "since=2026-03-01T12:00:00Z&until=2026-03-02T00:00:00Z",
		"limit=0", "tenant=/x", "tenant=a&org_id=b", "since=2026-03-02T00:00:00Z&until=2026-03-01T00:00:00Z", "limit=99999999999999999999"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		rf, err := api.ParseRunFilter(q)
		if err != nil {
			return
		}
		if rf.Status != "" && !slices.Contains(store.RunStatuses(), rf.Status) {
			t.Fatalf("status %q accepted", rf.Status)
		}
		if !rf.Since.IsZero() && !rf.Until.IsZero() && !rf.Since.Before(rf.Until) {
			t.Fatalf("since %v not before until %v", rf.Since, rf.Until)
		}
		if rf.Limit < 0 || (q.Get("limit") != "" && rf.Limit < 1) {
			t.Fatalf("limit %d accepted", rf.Limit)
		}
		if l := rf.EffectiveLimit(); l < 1 || l > store.MaxListLimit {
			t.Fatalf("effective limit %d", l)
		}
	})
}
