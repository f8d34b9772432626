package recorder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/service"
)

// The streams drop their oldest events past their max age and max bytes
// (TOOLWIRE_STREAM_MAX_AGE, TOOLWIRE_STREAM_MAX_BYTES), recorded or not. A
// recorder that falls far enough behind would lose events to those limits
// without a word; the retention watch says so well before: a gauge of how
// much of each limit the recorder's backlog uses, and a warning from
// retentionWarn on.
const (
	retentionEvery = 30 * time.Second
	retentionWarn  = 0.5
	retentionAsk   = 5 * time.Second
)

// retentionUse is how close one stream's limits are to dropping events the
// recorder has not recorded: the age of its oldest unrecorded event over the
// stream's max age, and the stream's size over its max bytes while the
// recorder has a backlog (0: no backlog, or no such limit).
type retentionUse struct {
	Stream, Consumer string
	Backlog          uint64
	OldestAge        time.Duration
	MaxAge           time.Duration
	Bytes, MaxBytes  uint64
	AgeRatio         float64
	BytesRatio       float64
}

// retentionGauge is the metric of retentionUse.
func newRetentionGauge(m *service.Metrics) *prometheus.GaugeVec {
	return m.GaugeVec("retention_used_ratio",
		"How much of a stream's retention limit the recorder's backlog uses, by stream and limit: age (the oldest unrecorded event's age over the stream's max age) and bytes (the stream's size over its max bytes, while events wait). At 1, events are dropped unrecorded.",
		"stream", "limit")
}

// checkRetention measures retentionUse for the recorder's consumers at now.
func checkRetention(ctx context.Context, js jetstream.JetStream, specs []provision.ConsumerSpec, now time.Time) ([]retentionUse, error) {
	var (
		out  []retentionUse
		errs []error
	)
	for _, spec := range specs {
		u, err := retentionOf(ctx, js, spec, now)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, u)
	}
	return out, errors.Join(errs...)
}

func retentionOf(ctx context.Context, js jetstream.JetStream, spec provision.ConsumerSpec, now time.Time) (retentionUse, error) {
	u := retentionUse{Stream: spec.Stream, Consumer: spec.Durable}
	s, err := js.Stream(ctx, spec.Stream)
	if err != nil {
		return u, fmt.Errorf("retention of %s: %w", spec.Stream, err)
	}
	si, err := s.Info(ctx)
	if err != nil {
		return u, fmt.Errorf("retention of %s: %w", spec.Stream, err)
	}
	c, err := s.Consumer(ctx, spec.Durable)
	if err != nil {
		return u, fmt.Errorf("retention of %s: consumer %s: %w", spec.Stream, spec.Durable, err)
	}
	ci, err := c.Info(ctx)
	if err != nil {
		return u, fmt.Errorf("retention of %s: consumer %s: %w", spec.Stream, spec.Durable, err)
	}
	u.MaxAge, u.Bytes = si.Config.MaxAge, si.State.Bytes
	if si.Config.MaxBytes > 0 {
		u.MaxBytes = uint64(si.Config.MaxBytes)
	}
	u.Backlog = ci.NumPending + uint64(max(ci.NumAckPending, 0)) //nolint:gosec // not negative
	if u.Backlog == 0 {
		return u, nil
	}
	if u.MaxBytes > 0 {
		u.BytesRatio = float64(u.Bytes) / float64(u.MaxBytes)
	}
	// The oldest event not yet recorded: the first above the ack floor that
	// the stream still holds.
	seq := max(ci.AckFloor.Stream+1, si.State.FirstSeq)
	if u.MaxAge > 0 && seq <= si.State.LastSeq {
		m, err := s.GetMsg(ctx, seq)
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return u, fmt.Errorf("retention of %s: event %d: %w", spec.Stream, seq, err)
		}
		if m != nil {
			u.OldestAge = max(now.Sub(m.Time), 0)
			u.AgeRatio = float64(u.OldestAge) / float64(u.MaxAge)
		}
	}
	return u, nil
}

// watchRetention checks the recorder's streams every retentionEvery until
// life ends, setting the gauge and warning about a backlog that uses
// retentionWarn of a limit or more.
func (r *Service) watchRetention(life context.Context, gauge *prometheus.GaugeVec) {
	t := time.NewTicker(retentionEvery)
	defer t.Stop()
	for {
		ctx, cancel := context.WithTimeout(life, retentionAsk)
		uses, err := checkRetention(ctx, r.JS, ConsumerSpecs(), time.Now())
		cancel()
		if err != nil && life.Err() == nil {
			r.Log.Debug("retention watch", "err", err)
		}
		for _, u := range uses {
			reportRetention(r.Log, gauge, u)
		}
		select {
		case <-life.Done():
			return
		case <-t.C:
		}
	}
}

// reportRetention sets the gauge of u and warns when a limit is near.
func reportRetention(log *slog.Logger, gauge *prometheus.GaugeVec, u retentionUse) {
	gauge.WithLabelValues(u.Stream, "age").Set(u.AgeRatio)
	gauge.WithLabelValues(u.Stream, "bytes").Set(u.BytesRatio)
	if u.AgeRatio >= retentionWarn {
		log.Warn("the recorder is behind the stream's max age: past it, events are dropped unrecorded; "+
			"look at the database and the recorder's errors, add recorder replicas, or raise TOOLWIRE_STREAM_MAX_AGE",
			"stream", u.Stream, "consumer", u.Consumer, "oldest_unrecorded_age", u.OldestAge.Round(time.Second),
			"max_age", u.MaxAge, "backlog", u.Backlog)
	}
	if u.BytesRatio >= retentionWarn {
		log.Warn("the recorder is behind while the stream nears its max bytes: past it, the oldest events are dropped unrecorded; "+
			"look at the database and the recorder's errors, add recorder replicas, or raise TOOLWIRE_STREAM_MAX_BYTES",
			"stream", u.Stream, "consumer", u.Consumer, "bytes", u.Bytes, "max_bytes", u.MaxBytes, "backlog", u.Backlog)
	}
}
