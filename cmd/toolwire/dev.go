package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/toolwire/toolwire/demo"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/identity"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/apiclient"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
	"github.com/toolwire/toolwire/stack"
)

const localPostgres = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable&connect_timeout=2"

type devFlags struct {
	demo        bool
	dataDir     string
	natsListen  string
	httpListen  string
	databaseURL string
	logLevel    string
	timeout     time.Duration
	natsAuth    bool
	workers     []string
}

func newDevCmd() *cobra.Command {
	var f devFlags
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run embedded NATS and every service in one process",
		Long: `dev runs an embedded nats-server with JetStream (its store in --data-dir) and all
five services in this process. The recorder writes to DATABASE_URL (a Postgres
URL, or sqlite:<path>); when that is unset and a Postgres answers on
127.0.0.1:5432, dev uses its "toolwire" database (creating it); otherwise it
stores runs in SQLite, in <data-dir>/recorder.db. The recorder's API and the
timeline page are served on --http.

With --demo it submits the demo run, shows each tool call as it happens, prints
the final AgentOutputs as JSON on stdout and exits.

Everything shares one Go runtime, so dev sets its collector for that: GOGC=400
with a 1 GiB soft memory limit (GOMEMLIMIT), about a tenth less CPU per tool
call under load. Set GOGC or GOMEMLIMIT to choose otherwise.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			setOneProcessGC(os.Getenv)
			return runDev(cmd.Context(), f, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&f.demo, "demo", false, "submit the demo run, print its AgentOutputs and exit")
	fl.StringVar(&f.dataDir, "data-dir", devDataDir, "folder for the embedded JetStream store")
	fl.StringVar(&f.natsListen, "nats-listen", "", `embedded NATS host:port (default "127.0.0.1:4223"; with --demo a free port)`)
	fl.StringVar(&f.httpListen, "http", "", `recorder API host:port (default "127.0.0.1:8088"; with --demo a free port)`)
	fl.StringVar(&f.databaseURL, "database-url", os.Getenv("DATABASE_URL"), "recorder database: a Postgres URL or sqlite:<path> (default $DATABASE_URL, else a local Postgres, else SQLite in --data-dir)")
	fl.StringVar(&f.logLevel, "log-level", "warn", "service log level: debug, info, warn, error")
	fl.StringArrayVar(&f.workers, "worker", nil, "let in a worker serving this queue (queue or queue1+queue2; repeatable): its seed is <data-dir>/identities/worker.<queues>.nk, kept across restarts")
	fl.BoolVar(&f.natsAuth, "nats-auth", true, "let into the embedded NATS only the nkey users of toolwire's roles, each limited to its role's subjects (seeds in <data-dir>/identities; the CLI finds the operator's); false lets anyone on the address do anything")
	fl.DurationVar(&f.timeout, "timeout", 2*time.Minute, "with --demo: how long to wait for the run")
	return cmd
}

func runDev(ctx context.Context, f devFlags, stdout, stderr io.Writer) (err error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", f.logLevel)
	}
	if f.natsListen == "" {
		f.natsListen = "127.0.0.1:4223"
		if f.demo {
			f.natsListen = "127.0.0.1:0"
		}
	}
	if f.httpListen == "" {
		f.httpListen = "127.0.0.1:8088"
		if f.demo {
			f.httpListen = "127.0.0.1:0"
		}
	}
	say := func(format string, args ...any) { fmt.Fprintf(stderr, "toolwire dev: "+format+"\n", args...) }

	// Spans go wherever the standard OTEL_ variables say; without them trace
	// ids are still recorded, so every run has one.
	tp, err := service.TracerProvider(ctx, "dev", os.Getenv)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, tp.Shutdown(context.WithoutCancel(ctx))) }()

	dbURL, why := resolveDatabase(ctx, f.databaseURL)
	if dbURL == "" {
		dbURL = sqlite.URL(filepath.Join(f.dataDir, "recorder.db"))
		say("%s: the recorder stores runs in SQLite (%s)", why, filepath.Join(f.dataDir, "recorder.db"))
	}
	if len(f.workers) > 0 {
		if !f.natsAuth {
			return errors.New("--worker makes a worker's identity: it needs --nats-auth (a server that lets anyone in needs none)")
		}
		keys, err := identity.LoadOrCreate(stack.IdentitiesDir(f.dataDir))
		if err != nil {
			return err
		}
		for _, q := range f.workers {
			w, err := identity.ParseWorker(q)
			if err == nil {
				err = keys.AddWorker(w)
			}
			if err != nil {
				return fmt.Errorf("--worker %q: %w", q, err)
			}
		}
	}
	st, err := stack.Start(ctx, stack.Options{
		DataDir: f.dataDir, NATSListen: f.natsListen, Recorder: recorder.ForStack(dbURL), HTTPListen: f.httpListen,
		Identities:        f.natsAuth,
		Logger:            slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})),
		Tracer:            tp,
		TracesURLTemplate: os.Getenv(service.EnvTracesTemplate),
	})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, st.Stop(context.WithoutCancel(ctx))) }()
	say("embedded NATS with JetStream at %s (store in %s)", st.URL, f.dataDir)
	if st.Identities != nil {
		say("NATS lets in only toolwire's roles, each with its nkey seed in %s: the CLI run from this folder finds the operator's; "+
			"a worker needs an identity of its queue: restart with --worker QUEUE (docs/operations.md: Accounts; --nats-auth=false turns this off)",
			st.Identities.Dir)
		for _, w := range st.Identities.Workers() {
			say("a worker serving %s connects with %s=%s", strings.Join(w.Queues, ", "), service.EnvNATSSeedFile, st.Identities.WorkerSeedFile(w))
		}
		for _, t := range st.Identities.Tenants() {
			say("a producer limited to tenant %s may hand in run requests on its intake: %s=%s %s=%s",
				t, service.EnvNATSSeedFile, st.Identities.TenantSeedFile(t), service.EnvNATSInbox, identity.TenantInboxPrefix(st.Identities.TenantPublic(t)))
		}
	}
	if st.HTTPURL != "" {
		say("recorder on %s; API at %s/v1/runs, timeline at %s/", redact(dbURL), st.HTTPURL, st.HTTPURL)
		if rec, ok := st.Recorder.(*recorder.Service); ok && rec.Config().Auth().On() {
			say("authentication on: make a token with toolwire tokens create --database-url %q --name me --org ORG --role approver", redact(dbURL))
		}
	}
	if !f.demo {
		say("all services running; press Ctrl-C to stop")
		<-ctx.Done()
		say("shutting down")
		return nil
	}
	return runDemo(ctx, st, f.timeout, stdout, stderr)
}

func runDemo(ctx context.Context, st *stack.Stack, timeout time.Duration, stdout, stderr io.Writer) error {
	runID := "demo-" + time.Now().UTC().Format("20060102-150405.000000")
	runID = strings.ReplaceAll(runID, ".", "-")
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := st.Client.Submit(ctx, demo.Request(runID)); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "run %s submitted\n", runID)
	final, err := st.Client.Follow(ctx, runID, progressPrinter(stderr))
	if err != nil {
		return fmt.Errorf("run %s: %w", runID, err)
	}
	if final.Status != events.StatusCompleted {
		return fmt.Errorf("run %s %s: %s", runID, final.Status, final.Reason)
	}
	if err := printJSON(stdout, final.Outputs); err != nil {
		return err
	}
	if st.HTTPURL != "" {
		// The timeline named below shows the run whole: its end and every
		// call's steps.
		if _, err := apiclient.WaitSettled(ctx, st.HTTPURL, runID, 50*time.Millisecond); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "recorded: %s/v1/runs/%s (timeline: %s/runs/%s)\n", st.HTTPURL, runID, st.HTTPURL, runID)
	}
	return nil
}

// resolveDatabase picks the recorder's database: the given URL, else the local
// Postgres's "toolwire" database (created when missing), else none, with why.
func resolveDatabase(ctx context.Context, url string) (string, string) {
	if url != "" {
		return url, ""
	}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, localPostgres)
	if err != nil {
		return "", "DATABASE_URL is unset and no Postgres answers on 127.0.0.1:5432"
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(cctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = 'toolwire')`).Scan(&exists); err != nil {
		return "", "the local Postgres did not answer a query (" + err.Error() + ")"
	}
	if !exists {
		if _, err := conn.Exec(cctx, `CREATE DATABASE toolwire`); err != nil && !strings.Contains(err.Error(), "already exists") {
			return "", "cannot create database toolwire on the local Postgres (" + err.Error() + ")"
		}
	}
	return "postgres://postgres@127.0.0.1:5432/toolwire?sslmode=disable", ""
}

func redact(url string) string {
	if i := strings.Index(url, "@"); i > 0 {
		if j := strings.Index(url, "://"); j > 0 && j < i {
			if k := strings.Index(url[j+3:i], ":"); k >= 0 {
				return url[:j+3+k] + ":***" + url[i:]
			}
		}
	}
	return url
}
