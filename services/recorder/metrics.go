package recorder

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolwire/toolwire/pkg/service"
)

// metrics are the recorder's: what it commits and how its database answers.
type metrics struct {
	// consumers counts what the service\'s consumers go through (failures,
	// redeliveries, dead letters).
	consumers *service.ConsumerMetrics

	recorded  prometheus.Counter
	dbUp      prometheus.Gauge
	outages   prometheus.Counter
	retention *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	return service.RegisterMetrics(reg, "recorder", func(r *service.Metrics, consumers *service.ConsumerMetrics) *metrics {
		m := &metrics{
			consumers: consumers,
			recorded: r.Counter("events_recorded_total",
				"Events committed to the database (a redelivered event counts again; it changes nothing)."),
			dbUp: r.Gauge("database_up",
				"1 while the database answers, 0 while the recorder holds events for it."),
			outages: r.Counter("database_outages_total",
				"Times the database became unreachable."),
			retention: newRetentionGauge(r),
		}
		m.dbUp.Set(1)
		return m
	})
}
