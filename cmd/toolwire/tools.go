package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
)

// cliNATS holds the --nats and --timeout flags of the registry, secrets and
// approval commands, which talk to NATS directly (KV writes and events: the
// same path as every service).
type cliNATS struct {
	url     string
	timeout time.Duration
}

func (n *cliNATS) flags(cmd *cobra.Command) {
	natsFlag(cmd.Flags(), &n.url)
	cmd.Flags().DurationVar(&n.timeout, "timeout", 30*time.Second, "how long the command may take")
}

// connect connects for one command; the returned context bounds it.
func (n *cliNATS) connect(ctx context.Context) (context.Context, *nats.Conn, jetstream.JetStream, func(), error) {
	ctx, cancel := contextWithTimeout(ctx, n.timeout)
	nc, js, err := connectCLI(ctx, n.url)
	if err != nil {
		cancel()
		return nil, nil, nil, nil, err // it names the URL
	}
	return ctx, nc, js, func() { nc.Close(); cancel() }, nil
}

// newToolsCmd is `toolwire tools`: the registry commands, beside `mcp`.
func newToolsCmd() *cobra.Command {
	var n cliNATS
	cmd := newToolsGroupCmd()
	cmd.Long = `tools manages the tool registry: the JetStream KV bucket of tool definitions
keyed name@version, with a lifecycle state (active, deprecated, blocked) that every
service watches. A new version is a new entry; older versions stay callable until
blocked. Changes take effect on running services at once.`
	var js jetstream.JetStream // the connection of the command running
	withRegistry := func(run func(ctx context.Context, cmd *cobra.Command, reg *registry.Registry, args []string) error) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			ctx, _, conn, done, err := n.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			js = conn
			reg, err := registry.Open(ctx, js)
			if err != nil {
				return err
			}
			return run(ctx, cmd, reg, args)
		}
	}

	var (
		search, category, state string
		asJSON                  bool
	)
	list := &cobra.Command{
		Use:   "list",
		Short: "List tool versions (every state unless --state)",
		Args:  cobra.NoArgs,
		RunE: withRegistry(func(ctx context.Context, cmd *cobra.Command, reg *registry.Registry, _ []string) error {
			f, err := toolFilter(search, category, state)
			if err != nil {
				return err
			}
			entries, err := reg.List(ctx)
			if err != nil {
				return err
			}
			entries = registry.Select(entries, f)
			// Each tool's queue and the live workers serving it (their
			// heartbeats); a server without them lists no workers.
			ws, err := registry.ListWorkers(ctx, js, time.Now())
			if err != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: no worker heartbeats: %v\n", err)
			}
			listed := listedTools(entries, registry.ByQueue(ws))
			if asJSON {
				return printJSON(cmd.OutOrStdout(), listed)
			}
			return printTools(cmd.OutOrStdout(), listed)
		}),
	}
	list.Flags().StringVar(&search, "search", "", "keep tools whose name or description holds this text (any case)")
	list.Flags().StringVar(&category, "category", "", "keep one category: api, code, data, search, utility")
	list.Flags().StringVar(&state, "state", "", "keep one state: active, deprecated, blocked")
	list.Flags().BoolVar(&asJSON, "json", false, "print the entries as JSON")
	outputFlag(list, &asJSON) // runs.go

	show := &cobra.Command{
		Use:   "show NAME@VERSION",
		Short: "Print a tool version's registry entry as JSON",
		Args:  cobra.ExactArgs(1),
		RunE: withRegistry(func(ctx context.Context, cmd *cobra.Command, reg *registry.Registry, args []string) error {
			ref, err := envelope.ParseToolRef(args[0])
			if err != nil {
				return err
			}
			e, err := reg.Get(ctx, ref)
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), e)
		}),
	}

	var draft bool
	register := &cobra.Command{
		Use:   "register FILE",
		Short: "Register a tool version from a JSON or YAML definition (\"-\": standard input)",
		Long: `register reads a tool definition (pkg/envelope/schemas/tool_definition.schema.json),
in JSON or YAML (by the file's extension .yaml/.yml, or by its content), checks it
against the schema, compiles its input and output schemas, and stores it as a new,
active tool version. Registering the same definition again changes nothing; a
changed definition under a registered version is refused: give it a new version.

--draft registers it as a draft instead: listed to admins (tools list, the
registry page), absent from the catalog, refused at run time, until
` + "`toolwire tools publish NAME@VERSION`" + `. Until then a draft may be registered
again with a changed definition, which replaces it.`,
		Args: cobra.ExactArgs(1),
		RunE: withRegistry(func(ctx context.Context, cmd *cobra.Command, reg *registry.Registry, args []string) error {
			def, err := readDefinition(args[0], cmd.InOrStdin())
			if err != nil {
				return err
			}
			register, state := reg.RegisterAs, registry.StateActive
			if draft {
				register, state = reg.RegisterDraftAs, registry.StateDraft
			}
			created, err := register(ctx, def, cliActor())
			if err != nil {
				return err
			}
			switch {
			case created:
				fmt.Fprintf(cmd.OutOrStdout(), "registered %s (%s)\n", def.Ref(), state)
			case draft:
				fmt.Fprintf(cmd.OutOrStdout(), "%s is a draft with this definition now\n", def.Ref())
			default:
				fmt.Fprintf(cmd.OutOrStdout(), "%s is already registered with this definition; nothing changed\n", def.Ref())
			}
			return nil
		}),
	}

	setState := func(verb string, st registry.State, short string) *cobra.Command {
		return &cobra.Command{
			Use:   verb + " NAME@VERSION",
			Short: short,
			Args:  cobra.ExactArgs(1),
			RunE: withRegistry(func(ctx context.Context, cmd *cobra.Command, reg *registry.Registry, args []string) error {
				ref, err := envelope.ParseToolRef(args[0])
				if err != nil {
					return err
				}
				if err := reg.SetStateAs(ctx, ref, st, cliActor()); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s is now %s\n", ref, st)
				return nil
			}),
		}
	}
	register.Flags().BoolVar(&draft, "draft", false, "register the version as a draft, to publish after review")
	publish := &cobra.Command{
		Use:   "publish NAME@VERSION",
		Short: "Publish a draft version: it becomes active, runs, and every tenant's catalog lists it",
		Args:  cobra.ExactArgs(1),
		RunE: withRegistry(func(ctx context.Context, cmd *cobra.Command, reg *registry.Registry, args []string) error {
			ref, err := envelope.ParseToolRef(args[0])
			if err != nil {
				return err
			}
			if err := reg.Publish(ctx, ref, cliActor()); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s is published (active)\n", ref)
			return nil
		}),
	}
	subs := []*cobra.Command{list, show, register, publish,
		setState("deprecate", registry.StateDeprecated, "Deprecate a tool version: still callable, hidden from the catalog, warned about"),
		setState("block", registry.StateBlocked, "Block a tool version: refused at run time with POLICY_DENIED"),
		setState("activate", registry.StateActive, "Make a tool version active again"),
	}
	for _, sub := range subs {
		n.flags(sub)
	}
	cmd.AddCommand(subs...)
	return cmd
}

func toolFilter(search, category, state string) (registry.Filter, error) {
	f := registry.Filter{Search: search}
	if category != "" {
		switch c := envelope.Category(category); c {
		case envelope.CategoryAPI, envelope.CategoryCode, envelope.CategoryData, envelope.CategorySearch, envelope.CategoryUtility:
			f.Category = c
		default:
			return f, fmt.Errorf("--category %q is not one of api, code, data, search, utility", category)
		}
	}
	if state != "" {
		st, err := registry.ParseState(state)
		if err != nil {
			return f, fmt.Errorf("--state %q is not one of active, deprecated, blocked, draft", state)
		}
		f.States = []registry.State{st}
	}
	return f, nil
}

// listedTool is a registry entry as `tools list` shows it: with its queue
// and the live workers that serve the queue.
type listedTool struct {
	registry.Entry
	Queue   string            `json:"queue"`
	Workers []registry.Worker `json:"workers"`
	// Health is from the live executors' circuits (registry.HealthOf).
	Health registry.Health `json:"health"`
}

func listedTools(entries []registry.Entry, byQueue map[string][]registry.Worker) []listedTool {
	var live []registry.Worker
	for _, ws := range byQueue {
		live = append(live, ws...)
	}
	health := registry.HealthOf(live, time.Now())
	out := make([]listedTool, 0, len(entries))
	for _, e := range entries {
		q := cmp.Or(e.Definition.Queue, envelope.DefaultQueue)
		out = append(out, listedTool{Entry: e, Queue: q, Workers: append([]registry.Worker{}, byQueue[q]...), Health: health(e.Definition.Ref().String())})
	}
	return out
}

func printTools(w io.Writer, tools []listedTool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOOL\tSTATE\tHEALTH\tCATEGORY\tSIDE EFFECTS\tSECRETS\tQUEUE\tWORKERS\tDESCRIPTION")
	for _, t := range tools {
		d := t.Definition
		sec := strings.Join(d.RequiredSecrets, ",")
		if sec == "" {
			sec = "-"
		}
		workers := "none" // no live worker: its calls fail after the guard's queue wait
		if len(t.Workers) > 0 {
			workers = strconv.Itoa(len(t.Workers))
		}
		health := string(t.Health.Status)
		if !t.Health.OpenUntil.IsZero() {
			health += " until " + t.Health.OpenUntil.UTC().Format("15:04:05")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Ref(), t.State, health, d.Metadata.Category, d.Metadata.SideEffects, sec,
			t.Queue, workers, clip(firstLine(d.Description), 60))
	}
	return tw.Flush()
}

// printJSON writes v to w as indented JSON, as every command's output.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// readJSONOrYAML reads a file ("-": r) and returns it as JSON: YAML (by the
// extension .yaml or .yml, or when the content is not JSON) is converted.
func readJSONOrYAML(path string, r io.Reader) ([]byte, error) {
	b, err := readInput(path, r)
	if err != nil {
		return nil, err
	}
	ext := strings.ToLower(filepath.Ext(path))
	if ext == ".json" || (ext != ".yaml" && ext != ".yml" && json.Valid(b)) {
		return b, nil
	}
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		return nil, fmt.Errorf("%s: not valid YAML: %w", path, err)
	}
	return j, nil
}

func readDefinition(path string, stdin io.Reader) (envelope.ToolDefinition, error) {
	b, err := readJSONOrYAML(path, stdin)
	if err != nil {
		return envelope.ToolDefinition{}, err
	}
	def, err := registry.DecodeDefinition(b)
	if err != nil {
		return def, fmt.Errorf("%s: %w", path, err)
	}
	return def, nil
}

// errFindings is returned by validate when a configuration cannot run.
var errFindings = errors.New("the configuration cannot run")

// cliActor is who a registry change made with the CLI is recorded as: the
// operating system's user, "cli:NAME".
func cliActor() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return "cli:" + u.Username
	}
	return "cli"
}
