package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/toolwire/toolwire/pkg/jetstream/secrets"
)

// scopeFlags are the flags naming a secret's scope.
type scopeFlags struct {
	level, org, workspace, user string
}

func (f *scopeFlags) bind(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.level, "scope", "", "the secret's scope: org, workspace or user (required)")
	cmd.Flags().StringVar(&f.org, "org", "", "org id (required)")
	cmd.Flags().StringVar(&f.workspace, "workspace", "", "workspace id (workspace scope)")
	cmd.Flags().StringVar(&f.user, "user", "", "user id (user scope)")
}

func (f *scopeFlags) scope() (secrets.Scope, error) {
	if f.level == "" {
		return secrets.Scope{}, fmt.Errorf("--scope is required: org, workspace or user")
	}
	lvl, err := secrets.ParseLevel(f.level)
	if err != nil {
		return secrets.Scope{}, err
	}
	return secrets.NewScope(lvl, f.org, f.workspace, f.user)
}

// newSecretsCmd is `toolwire secrets`: scoped secrets, sealed in NATS KV.
func newSecretsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secrets",
		Short: "Manage scoped secrets (org, workspace, user)",
		Long: `secrets stores the secrets tools need (their definitions' required_secrets), at
org, workspace or user scope. The executor resolves a tool's secrets for the run's
tenant from the narrowest scope that holds them: user, then workspace, then org.

Values are sealed with AES-256-GCM under a master key from TOOLWIRE_MASTER_KEYS
("id:base64key,..."; TOOLWIRE_MASTER_KEY_ID names the one for new writes when
there are several) and bound to their scope and name. Only the executor and this
CLI hold the keys; set, rotate and keygen need them, list and rm do not. A value is
read from standard input, never from an argument.`,
		Args: cobra.NoArgs,
	}
	withStore := func(n *cliNATS, needKeys bool, run func(ctx context.Context, cmd *cobra.Command, st *secrets.Store, args []string) error) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			keys, err := secrets.KeyringFromEnv(os.Getenv)
			if err != nil {
				return err
			}
			if needKeys && keys == nil {
				return secrets.ErrNoKeyring
			}
			ctx, _, js, done, err := n.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			st, err := openSecrets(ctx, js, keys)
			if err != nil {
				return err
			}
			return run(ctx, cmd, st, args)
		}
	}

	var (
		setN, listN, rmN, rotN, reN cliNATS
		setS, listS, rmS            scopeFlags
		listJSON                    bool
	)
	set := &cobra.Command{
		Use:   "set NAME --scope org|workspace|user --org ORG [--workspace WS] [--user USER] < value",
		Short: "Store a secret; its value is read from standard input",
		Example: `  printf %s "$OPENWEATHER_KEY" | toolwire secrets set OPENWEATHER_KEY --scope org --org acme
  toolwire secrets set GITHUB_TOKEN --scope user --org acme --user jane < token.txt`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fmt.Errorf("give the secret's NAME only: its value is read from standard input, never from an argument")
			}
			return nil
		},
		RunE: withStore(&setN, true, func(ctx context.Context, cmd *cobra.Command, st *secrets.Store, args []string) error {
			scope, err := setS.scope()
			if err != nil {
				return err
			}
			value, err := readSecretValue(cmd.InOrStdin())
			if err != nil {
				return err
			}
			if err := st.Set(ctx, scope, args[0], value); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "secret %s set in %s (%d bytes)\n", args[0], scope, len(value))
			return nil
		}),
	}
	setN.flags(set)
	setS.bind(set)

	list := &cobra.Command{
		Use:   "list --scope org|workspace|user --org ORG [--workspace WS] [--user USER]",
		Short: "List the secrets of a scope (names only, never values)",
		Args:  cobra.NoArgs,
		RunE: withStore(&listN, false, func(ctx context.Context, cmd *cobra.Command, st *secrets.Store, _ []string) error {
			scope, err := listS.scope()
			if err != nil {
				return err
			}
			infos, err := st.List(ctx, scope)
			if err != nil {
				return err
			}
			if listJSON {
				return printJSON(cmd.OutOrStdout(), secretList(infos))
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSCOPE\tKEY ID\tUPDATED")
			for _, i := range infos {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", i.Name, i.Scope, i.KeyID, i.UpdatedAt.Format(time.RFC3339))
			}
			return tw.Flush()
		}),
	}
	listN.flags(list)
	listS.bind(list)
	jsonFlag(list, &listJSON) // runs.go

	rm := &cobra.Command{
		Use:   "rm NAME --scope org|workspace|user --org ORG [--workspace WS] [--user USER]",
		Short: "Remove a secret (with its history)",
		Args:  cobra.ExactArgs(1),
		RunE: withStore(&rmN, false, func(ctx context.Context, cmd *cobra.Command, st *secrets.Store, args []string) error {
			scope, err := rmS.scope()
			if err != nil {
				return err
			}
			if err := st.Delete(ctx, scope, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "secret %s removed from %s\n", args[0], scope)
			return nil
		}),
	}
	rmN.flags(rm)
	rmS.bind(rm)

	rotate := &cobra.Command{
		Use:   "rotate",
		Short: "Reseal every secret under the current master key (TOOLWIRE_MASTER_KEY_ID)",
		Long: `rotate re-encrypts every secret that is sealed under another master key than the
current one. Rotate a master key in three steps: add the new key to
TOOLWIRE_MASTER_KEYS and make it current with TOOLWIRE_MASTER_KEY_ID (on the
executors and here), run rotate, then remove the old key.`,
		Args: cobra.NoArgs,
		RunE: withStore(&rotN, true, func(ctx context.Context, cmd *cobra.Command, st *secrets.Store, _ []string) error {
			n, err := st.Reseal(ctx)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d secrets resealed\n", n)
			return nil
		}),
	}
	rotN.flags(rotate)

	reindex := &cobra.Command{
		Use:   "reindex",
		Short: "Name every stored secret in the names bucket (what the tool catalog reads), and drop names of no secret",
		Long: `reindex makes toolwire_secret_names hold exactly the keys of toolwire_secrets:
the recorder's tool catalog reads which scopes hold a key from there, never a
sealed value. secrets set and rm keep it so; run reindex once after upgrading
from a version without it, or when set or rm said a name was not written. It
needs no master key and reads no value.`,
		Args: cobra.NoArgs,
		RunE: withStore(&reN, false, func(ctx context.Context, cmd *cobra.Command, st *secrets.Store, _ []string) error {
			n, err := st.Reindex(ctx)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d secret names added or removed\n", n)
			return nil
		}),
	}
	reN.flags(reindex)

	var keyID string
	keygen := &cobra.Command{
		Use:   "keygen",
		Short: "Print a new random master key as id:base64key, for TOOLWIRE_MASTER_KEYS",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			k, err := secrets.GenerateKey(keyID)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), k)
			return nil
		},
	}
	keygen.Flags().StringVar(&keyID, "id", "k1", "the key's id")

	cmd.AddCommand(set, list, rm, rotate, reindex, keygen)
	return cmd
}

func openSecrets(ctx context.Context, js jetstream.JetStream, keys *secrets.Keyring) (*secrets.Store, error) {
	st, err := secrets.Open(ctx, js, keys)
	if err != nil {
		return nil, fmt.Errorf("%w (is toolwire provisioned on this NATS?)", err)
	}
	return st, nil
}

// readSecretValue reads a value from r, without one trailing newline (as
// echo and most editors add).
func readSecretValue(r io.Reader) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, secrets.MaxValueSize+2))
	if err != nil {
		return nil, fmt.Errorf("read the value from standard input: %w", err)
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	b = bytes.TrimSuffix(b, []byte("\r"))
	if len(b) == 0 {
		return nil, errors.New(`no value on standard input: pipe the secret in (printf %s "$VALUE" | toolwire secrets set NAME --scope ...)`)
	}
	return b, nil
}

// secretList is the secrets of `toolwire secrets list --json`: names and
// scopes, never values; [] when there are none.
func secretList(infos []secrets.Info) []secrets.Info {
	if infos == nil {
		return []secrets.Info{}
	}
	return infos
}
