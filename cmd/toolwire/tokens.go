package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// tokensTimeout bounds each tokens command's database work.
const tokensTimeout = 30 * time.Second

// newTokensCmd is `toolwire tokens create|list|revoke`: the API tokens of
// the recorder, kept (hashed) in its database.
func newTokensCmd() *cobra.Command {
	var databaseURL string
	cmd := &cobra.Command{
		Use:   "tokens",
		Short: "Create, list and revoke the recorder's API tokens",
		Long: `tokens manages the API tokens the recorder's HTTP API, live stream and pages
accept when authentication is on (TOOLWIRE_AUTH=on). A token is bound to an org
(and optionally one of its workspaces) and has a role: viewer reads, producer
also submits and cancels runs over the HTTP API (an upstream system's token),
approver also decides approvals (timeline page or API), admin also manages the tool
registry (only with --org '*', every tenant). The database keeps only the
SHA-256 of each token's secret: a token is shown once, when it is created.

The commands work on the recorder's database directly (--database-url, default
$DATABASE_URL; for toolwire dev, sqlite:.toolwire/recorder.db or its Postgres).`,
	}
	cmd.PersistentFlags().StringVar(&databaseURL, "database-url", os.Getenv("DATABASE_URL"),
		"the recorder's database: a Postgres URL or sqlite:<path> (default $DATABASE_URL)")
	open := func(cmd *cobra.Command) (context.Context, store.Tokens, func(), error) {
		ctx, cancel := context.WithTimeout(cmd.Context(), tokensTimeout)
		if databaseURL == "" {
			cancel()
			return nil, nil, nil, errors.New("--database-url (or DATABASE_URL) is required: the recorder's database, " +
				"for example sqlite:.toolwire/recorder.db for toolwire dev")
		}
		tokens, closeTokens, err := recorder.OpenTokens(ctx, databaseURL, slog.New(slog.DiscardHandler))
		if err != nil {
			cancel()
			return nil, nil, nil, err
		}
		return ctx, tokens, func() { closeTokens(); cancel() }, nil
	}

	var spec tokenFlags
	create := &cobra.Command{
		Use:   "create --name NAME --org ORG --role viewer|producer|approver|admin [--workspace WS] [--ttl DURATION]",
		Short: "Create a token; it is printed once, on stdout",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := spec.spec()
			if err != nil {
				return err
			}
			ctx, tokens, done, err := open(cmd)
			if err != nil {
				return err
			}
			defer done()
			tok, row, err := auth.NewToken(s, time.Now())
			if err != nil {
				return err
			}
			if err := tokens.CreateToken(ctx, row); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), tok)
			fmt.Fprintf(cmd.ErrOrStderr(), "token %s (%s): %s of %s; shown this once, keep it secret\n", row.ID, row.Name, row.Role, tenantOf(row))
			return nil
		},
	}
	fl := create.Flags()
	fl.StringVar(&spec.name, "name", "", "who or what uses the token (required)")
	fl.StringVar(&spec.org, "org", "", "the org it may read (required); '*' for every tenant (admin only)")
	fl.StringVar(&spec.workspace, "workspace", "", "one workspace of the org (default: all of them)")
	fl.StringVar(&spec.role, "role", "viewer", "viewer, producer, approver or admin")
	fl.DurationVar(&spec.ttl, "ttl", 0, "expire after this long, e.g. 720h (default: never)")

	var listJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List the tokens (never their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, tokens, done, err := open(cmd)
			if err != nil {
				return err
			}
			defer done()
			all, err := tokens.ListTokens(ctx)
			if err != nil {
				return err
			}
			if listJSON {
				return printJSON(cmd.OutOrStdout(), tokenList(all))
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tTENANT\tROLE\tCREATED\tEXPIRES\tSTATE")
			now := time.Now()
			for _, t := range all {
				exp, state := "never", "active"
				if t.ExpiresAt != nil {
					exp = t.ExpiresAt.Format(time.RFC3339)
					if !now.Before(*t.ExpiresAt) {
						state = "expired"
					}
				}
				if t.RevokedAt != nil {
					state = "revoked " + t.RevokedAt.Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Name, tenantOf(t), t.Role, t.CreatedAt.Format(time.RFC3339), exp, state)
			}
			return tw.Flush()
		},
	}
	jsonFlag(list, &listJSON) // runs.go
	revoke := &cobra.Command{
		Use:   "revoke TOKEN_ID",
		Short: "Revoke a token: the recorder refuses it from its next request",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := auth.ValidateTokenID(args[0]); err != nil {
				return err
			}
			ctx, tokens, done, err := open(cmd)
			if err != nil {
				return err
			}
			defer done()
			if err := tokens.RevokeToken(ctx, args[0], time.Now()); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked: token %s\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(create, list, revoke)
	return cmd
}

// tokenFlags are the flags of `tokens create`.
type tokenFlags struct {
	name, org, workspace, role string
	ttl                        time.Duration
}

func (f tokenFlags) spec() (auth.TokenSpec, error) {
	role, err := auth.ParseRole(f.role)
	if err != nil {
		return auth.TokenSpec{}, err
	}
	s := auth.TokenSpec{Name: f.name, OrgID: f.org, WorkspaceID: f.workspace, Role: role, TTL: f.ttl}
	return s, s.Validate()
}

func tenantOf(t store.Token) string {
	switch {
	case t.OrgID == auth.AllTenants:
		return "every tenant"
	case t.WorkspaceID != "":
		return t.OrgID + "/" + t.WorkspaceID
	}
	return t.OrgID
}

// tokenJSON is a token as `toolwire tokens list --json` prints it: never
// its hash.
type tokenJSON struct {
	ID          string     `json:"id"`
	Name        string     `json:"name"`
	OrgID       string     `json:"org_id"`
	WorkspaceID string     `json:"workspace_id,omitempty"`
	Role        string     `json:"role"`
	CreatedAt   time.Time  `json:"created_at"`
	ExpiresAt   *time.Time `json:"expires_at"`
	RevokedAt   *time.Time `json:"revoked_at"`
}

func tokenList(all []store.Token) []tokenJSON {
	out := make([]tokenJSON, 0, len(all))
	for _, t := range all {
		out = append(out, tokenJSON{ID: t.ID, Name: t.Name, OrgID: t.OrgID, WorkspaceID: t.WorkspaceID, Role: t.Role,
			CreatedAt: t.CreatedAt, ExpiresAt: t.ExpiresAt, RevokedAt: t.RevokedAt})
	}
	return out
}
