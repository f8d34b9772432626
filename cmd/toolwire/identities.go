package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/identity"
)

func newIdentitiesCmd() *cobra.Command {
	var (
		dir     string
		tenants []string
		workers []string
	)
	cmd := &cobra.Command{
		Use:   "identities",
		Short: "Create the NATS nkeys of toolwire's roles and print the server's authorization config",
		Long: `identities creates one nkey user per role (orchestrator, policy, executor,
sandbox, recorder, operator, producer) in --dir, each seed in <role>.nk (mode
0600; existing seeds are kept), and prints the authorization block of a
nats-server configuration that lets in exactly these users, each limited to
its role's subjects (docs/operations.md: Who may publish what).

Give each binary its role's seed: ` + service.EnvNATSSeedFile + `=/path/<role>.nk
(an upstream system producer.nk; the CLI of the people who run toolwire
operator.nk). ` + "`toolwire dev`" + ` does all of this by itself. The printed block is
an accounts block: the services and the operator in the system account
TOOLWIRE, the producer, each tenant and each worker in an account of its own
(docs/operations.md: Accounts).

--worker queue (or queue1+queue2) adds the identity of a worker serving those
queues, its seed in worker.<queues>.nk: it may only register its tools on its
queues, announce itself and answer the calls the executors hand it there; it
has no JetStream access. A queue belongs to one worker identity (its replicas
share the seed).

--tenant org (or org/workspace) adds a producer limited to that tenant, its
seed in tenant.<org>[.<workspace>].nk: it may only hand in run requests on
its tenant's intake subjects (client.SubmitToIntake), nothing else; the
orchestrator takes a request there only if it is that tenant's. Tenants
added before are kept and printed again. Such a producer connects with
TOOLWIRE_NATS_INBOX_PREFIX=_INBOX_<its public key> (printed below), and
follows its runs through the recorder's API with a token of its org.`,
		Example: `  toolwire identities --dir ./nats-identities > auth.conf
  # nats-server.conf: include ./auth.conf
  toolwire identities --dir ./nats-identities --tenant acme --tenant globex/eu > auth.conf
  toolwire identities --dir ./nats-identities --worker billing > auth.conf`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var add []identity.Tenant
			for _, s := range tenants {
				t, err := identity.ParseTenant(s)
				if err != nil {
					return fmt.Errorf("--tenant %q: %w", s, err)
				}
				add = append(add, t)
			}
			keys, err := identity.LoadOrCreate(dir)
			if err != nil {
				return err
			}
			for _, t := range add {
				if err := keys.AddTenant(t); err != nil {
					return fmt.Errorf("--tenant %s: %w", t, err)
				}
			}
			for _, q := range workers {
				w, err := identity.ParseWorker(q)
				if err == nil {
					err = keys.AddWorker(w)
				}
				if err != nil {
					return fmt.Errorf("--worker %q: %w", q, err)
				}
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), keys.ServerConfig())
			if err != nil {
				return err
			}
			stderr := cmd.ErrOrStderr()
			fmt.Fprintf(stderr, "identities: the seeds are in %s; give each binary its own (%s)\n", dir, service.EnvNATSSeedFile)
			for _, t := range keys.Tenants() {
				fmt.Fprintf(stderr, "identities: tenant %s: %s=%s %s=%s\n", t, service.EnvNATSSeedFile, keys.TenantSeedFile(t),
					service.EnvNATSInbox, identity.TenantInboxPrefix(keys.TenantPublic(t)))
			}
			for _, w := range keys.Workers() {
				fmt.Fprintf(stderr, "identities: worker %s: %s=%s\n", w, service.EnvNATSSeedFile, keys.WorkerSeedFile(w))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "nats-identities", "folder for the roles' seeds (created mode 0700)")
	cmd.Flags().StringArrayVar(&workers, "worker", nil, "add a worker serving this queue: queue or queue1+queue2 (repeatable)")
	cmd.Flags().StringArrayVar(&tenants, "tenant", nil, "add a producer limited to this tenant: org or org/workspace (repeatable)")
	return cmd
}
