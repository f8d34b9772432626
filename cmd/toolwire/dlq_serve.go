package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/identity"
	"github.com/toolwire/toolwire/stack"
	"github.com/toolwire/toolwire/worker"
	"github.com/toolwire/toolwire/worker/dlqtools"
)

// EnvOperationsSeedFile names the operations role's seed for `dlq serve`.
const EnvOperationsSeedFile = "TOOLWIRE_OPERATIONS_NKEY_SEED_FILE"

func newDLQServeCmd(f *dlqFlags) *cobra.Command {
	var opsSeed, workerSeed string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the dead letters as tools for an operations agent, until interrupted",
		Long: `serve runs a worker on queue ` + dlqtools.Queue + ` with the tools list_dlq_events,
get_dlq_event_detail (its failure history sanitized of credentials) and
replay_dlq_event (side effects writes, risk high: every call waits for an
operator; its reason is recorded with who replayed what, as dlq replay
--reason records it, and dlq audit lists it). An agent enables them as any
tool: "enabled_tools": ["list_dlq_events@1.0.0", ...].

It connects twice: as the worker of queue ` + dlqtools.Queue + ` (--worker-seed, the seed
toolwire identities --worker ` + dlqtools.Queue + ` makes: an account that reaches only the
executors' requests for that queue) and as the operations role
(--operations-seed, operations.nk: the dead-letter stream, the bodies of
large dead letters, the replay audit and the replay of events that announce
what happened; never a command such as an approval decision, which an
operator replays with dlq replay). Without seeds it connects unauthenticated,
to a server that takes anyone. Defaults: the environment, else the seeds of a
` + "`toolwire dev`" + ` started in this folder with --worker ` + dlqtools.Queue + ` identities.

The worker logs, serves /healthz, /readyz and /metrics (TOOLWIRE_HTTP_ADDR)
and drains its calls on SIGINT or SIGTERM, as every worker does.`,
		Example: `  toolwire identities --dir ./nats-identities --worker ops > auth.conf
  toolwire dlq serve --worker-seed ./nats-identities/worker.ops.nk \
    --operations-seed ./nats-identities/operations.nk`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (opsSeed == "") != (workerSeed == "") {
				return errors.New("dlq serve: give both seeds (--worker-seed and --operations-seed) or neither: one identity cannot do the other's part")
			}
			js, err := dlqtools.Connect(f.natsURL, opsSeed)
			if err != nil {
				return err
			}
			defer js.Conn().Close()
			getenv := func(k string) string {
				switch k {
				case service.EnvNATSURL:
					return f.natsURL
				case service.EnvNATSSeedFile:
					return workerSeed
				case service.EnvNATSCreds:
					return ""
				}
				return os.Getenv(k)
			}
			tools := dlqtools.Tools(js)
			fmt.Fprintf(cmd.ErrOrStderr(), "dlq serve: %d tools on queue %s at %s (worker %s, operations %s); Ctrl-C stops\n",
				len(tools), dlqtools.Queue, f.natsURL, orNone(workerSeed), orNone(opsSeed))
			return worker.New(worker.Config{Queue: dlqtools.Queue, Getenv: getenv}, tools...).Run(cmd.Context())
		},
	}
	ids := stack.IdentitiesDir(devDataDir)
	cmd.Flags().StringVar(&opsSeed, "operations-seed", envOrExisting(EnvOperationsSeedFile, identity.SeedFile(ids, identity.Operations)),
		"the operations role's nkey seed (default $"+EnvOperationsSeedFile+", else a dev's)")
	cmd.Flags().StringVar(&workerSeed, "worker-seed", envOrExisting(service.EnvNATSSeedFile, identity.WorkerSeedFile(ids, identity.Worker{Queues: []string{dlqtools.Queue}})),
		"the worker identity's nkey seed for queue "+dlqtools.Queue+" (default $"+service.EnvNATSSeedFile+", else a dev's)")
	return cmd
}

// envOrExisting is $env, else path when it exists, else "".
func envOrExisting(env, path string) string {
	if v := os.Getenv(env); v != "" {
		return v
	}
	if _, err := os.Stat(path); err == nil {
		return path
	}
	return ""
}

func orNone(s string) string {
	if s == "" {
		return "unauthenticated"
	}
	return s
}
