package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/identity"
)

func newIdentitiesCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "identities",
		Short: "Create the NATS nkeys of toolwire's roles and print the server's authorization config",
		Long: `identities creates one nkey user per role (orchestrator, policy, executor,
sandbox, recorder, operator, producer) in --dir, each seed in <role>.nk (mode
0600; existing seeds are kept), and prints the authorization block of a
nats-server configuration that lets in exactly these users, each limited to
its role's subjects (README: Who may publish what).

Give each binary its role's seed: ` + service.EnvNATSSeedFile + `=/path/<role>.nk
(a worker uses executor.nk; an upstream system producer.nk; the CLI of the
people who run toolwire operator.nk). ` + "`toolwire dev`" + ` does all of this by itself.`,
		Example: `  toolwire identities --dir ./nats-identities > auth.conf
  # nats-server.conf: include ./auth.conf`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			keys, err := identity.LoadOrCreate(dir)
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), keys.ServerConfig())
			if err == nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "identities: the seeds are in %s; give each binary its own (%s)\n", dir, service.EnvNATSSeedFile)
			}
			return err
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "nats-identities", "folder for the roles' seeds (created mode 0700)")
	return cmd
}
