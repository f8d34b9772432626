package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/service"
)

func newProvisionCmd() *cobra.Command {
	var (
		natsURL  string
		store    provision.StoreConfig
		maxMiB   int64
		timeout  time.Duration
		storeDef = service.Common{Replicas: 1}
	)
	cmd := &cobra.Command{
		Use:   "provision",
		Short: "Create or change toolwire's streams, KV buckets and object stores",
		Long: `provision creates what is missing of toolwire's streams, KV buckets and object
stores on a NATS server (NATS_URL), and raises the replicas and retention of
what exists to the flags. Every service does the same at start, but none
lowers what exists: a service started with fewer replicas or a shorter
retention than the streams have refuses to start and says so. Lowering is an
operator's decision, made here with --lower.

The server must be nats-server ` + provision.MinServerVersion + ` or newer; on a cluster still forming,
provision waits for it (up to --timeout).`,
		Example: `  toolwire provision --nats nats://nats:4222 --replicas 3 --max-age 720h
  toolwire provision --replicas 1 --lower   # back to one replica, on purpose`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			store.MaxBytes = maxMiB << 20
			return withJetStream(cmd.Context(), natsURL, timeout, func(ctx context.Context, js jetstream.JetStream) error {
				w := cmd.ErrOrStderr()
				if err := provision.ProvisionRetrying(ctx, js, store, func(attempt int, err error) {
					fmt.Fprintf(w, "provision: not ready yet (attempt %d): %v\n", attempt, err)
				}); err != nil {
					return err
				}
				lister := js.ListStreams(ctx)
				for info := range lister.Info() {
					c := info.Config
					age := "none"
					if c.MaxAge > 0 {
						age = c.MaxAge.String()
					}
					size := "none"
					if c.MaxBytes > 0 {
						size = fmt.Sprintf("%d MiB", c.MaxBytes>>20)
					}
					fmt.Fprintf(cmd.OutOrStdout(), "%-26s replicas %d  max age %-10s max bytes %s\n", c.Name, c.Replicas, age, size)
				}
				return lister.Err()
			})
		},
	}
	fl := cmd.Flags()
	natsFlag(fl, &natsURL)
	fl.IntVar(&store.Replicas, "replicas", storeDef.Replicas, "replicas of every stream, bucket and store (1 to 5)")
	fl.DurationVar(&store.MaxAge, "max-age", 7*24*time.Hour, "how long the event streams keep events")
	fl.Int64Var(&maxMiB, "max-bytes", 0, "bound of each event stream's size in MiB (0: none but the age)")
	fl.BoolVar(&store.Lower, "lower", false, "lower the replicas or retention of what exists to these")
	fl.DurationVar(&timeout, "timeout", time.Minute, "how long to wait for the server (a cluster forming)")
	return cmd
}
