package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/identity"
)

func newIdentitiesCmd() *cobra.Command {
	var (
		dir     string
		out     string
		tenants []string
		workers []string
	)
	cmd := &cobra.Command{
		Use:   "identities",
		Short: "Create the NATS nkeys of toolwire's roles and print the server's authorization config",
		Long: `identities creates one nkey user per role (orchestrator, policy, executor,
sandbox, recorder, operator, producer, operations) in --dir, each seed in <role>.nk (mode
0600; existing seeds are kept), and prints the authorization block of a
nats-server configuration that lets in exactly these users, each limited to
its role's subjects (docs/operations.md: Who may publish what).

Give each binary its role's seed: ` + service.EnvNATSSeedFile + `=/path/<role>.nk
(an upstream system producer.nk; the CLI of the people who run toolwire
operator.nk; the process serving an operations agent's dead-letter tools
operations.nk, beside --worker ops: toolwire dlq serve). ` + "`toolwire dev`" + ` does all of this by itself. The printed block is
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
follows its runs through the recorder's API with a token of its org.

--out FILE writes the accounts block to FILE (mode 0644: public keys only)
instead of printing it, replacing the file in one rename, so that a server
started from it never reads half a file. Run again with the same --dir, it
writes the same file: the seeds are kept. This is what docker-compose.yml's
identities service does at every start (docs/operations.md: Production).`,
		Example: `  toolwire identities --dir ./nats-identities > auth.conf
  # nats-server.conf: include ./auth.conf
  toolwire identities --dir ./nats-identities --out ./nats/accounts.conf
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
			stderr := cmd.ErrOrStderr()
			if out != "" {
				if err := writeReplacing(out, []byte(keys.ServerConfig()), 0o644, nil); err != nil {
					return fmt.Errorf("identities: --out: %w", err)
				}
				fmt.Fprintf(stderr, "identities: the server's accounts block is in %s (include it in nats-server's config)\n", out)
			} else if _, err := fmt.Fprint(cmd.OutOrStdout(), keys.ServerConfig()); err != nil {
				return err
			}
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
	cmd.Flags().StringVar(&out, "out", "", "write the server's accounts block to this file instead of printing it")
	cmd.Flags().StringArrayVar(&workers, "worker", nil, "add a worker serving this queue: queue or queue1+queue2 (repeatable)")
	cmd.Flags().StringArrayVar(&tenants, "tenant", nil, "add a producer limited to this tenant: org or org/workspace (repeatable)")
	cmd.AddCommand(newCopySeedCmd())
	return cmd
}

func newCopySeedCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "copy-seed SRC DST",
		Short: "Copy a seed file to where a binary reads it, private to the user running this",
		Long: `copy-seed copies the nkey seed in SRC to DST, mode 0600 and owned by the
user running it, after checking that it holds a user seed (SU...).

A binary refuses a seed file that others than its owner may read. A
Kubernetes Secret volume cannot give a non-root container such a file: its
files belong to root, and a pod's fsGroup makes them group-readable. So
deploy/k8s runs this in an init container, as the service's user, from the
Secret volume into a memory emptyDir the service then reads
(docs/operations.md: Production).`,
		Example: `  toolwire identities copy-seed /var/run/secrets/toolwire/nats/seed.nk /var/run/toolwire/nats/seed.nk`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := args[0], args[1]
			b, err := os.ReadFile(src) //nolint:gosec // the operator names the file
			if err != nil {
				return fmt.Errorf("identities: copy-seed: %w", err)
			}
			// Checked before it takes DST's place: a binary never finds
			// there what it would refuse.
			var pub string
			check := func(tmp string) error {
				p, err := identity.PublicKey(tmp)
				if err != nil {
					return fmt.Errorf("%s: %w", src, err)
				}
				pub = p
				return nil
			}
			if err := writeReplacing(dst, b, 0o600, check); err != nil {
				return fmt.Errorf("identities: copy-seed: %w", err)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "identities: the seed of %s is in %s\n", pub, dst)
			return nil
		},
	}
}

// writeReplacing writes b to path with mode perm through a temporary file in
// path's folder renamed over path: a reader sees the old file or the new
// one, never part of it. check, unless nil, vets the temporary file first;
// its error leaves path as it was.
func writeReplacing(path string, b []byte, perm os.FileMode, check func(tmp string) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("cannot write in the folder of %s: %w", path, err)
	}
	_, err = f.Write(b)
	err = errors.Join(err, f.Chmod(perm), f.Close())
	if err == nil && check != nil {
		if err = check(f.Name()); err != nil {
			return errors.Join(err, os.Remove(f.Name()))
		}
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		return errors.Join(fmt.Errorf("write %s: %w", path, err), os.Remove(f.Name()))
	}
	return nil
}
