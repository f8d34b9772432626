package main

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/services/executor/tools/mcp"
)

// newToolsGroupCmd is the `toolwire tools` command with its `mcp`
// subcommand (MCP servers whose tools the executor runs); newToolsCmd
// (tools.go) adds the registry commands to it.
func newToolsGroupCmd() *cobra.Command {
	return groupCmd("tools", "Manage the tool registry",
		groupCmd("mcp", "Register the tools of MCP servers", newToolsMCPAddCmd()))
}

// groupCmd is a command that only holds its subcommands.
func groupCmd(use, short string, subs ...*cobra.Command) *cobra.Command {
	cmd := &cobra.Command{Use: use, Short: short, Args: cobra.NoArgs}
	cmd.AddCommand(subs...)
	return cmd
}

func newToolsMCPAddCmd() *cobra.Command {
	var (
		natsURL     string
		command     string
		url         string
		version     string
		bare        bool
		category    string
		sideEffects string
		toolTimeout time.Duration
		timeout     time.Duration
		dryRun      bool
	)
	cmd := &cobra.Command{
		Use:   `add NAME (--command "PROGRAM ARGS..." | --url URL)`,
		Short: "Connect to an MCP server and register each of its tools",
		Long: `add connects to an MCP server, lists its tools and writes a registry entry for
each: "<NAME>_<tool>@<version>" (--bare-names: the tool's own name) with the
tool's input schema (and output schema when it declares one). The executor runs
those entries by calling the server through the MCP Go SDK.

--command starts a stdio server: the program and its arguments, split like a
shell would (quotes and backslashes; no variables, globs or substitutions),
run without a shell. Every executor runs it too, so it must exist on the
executors' hosts; it gets only PATH, HOME, LANG, LC_ALL and TMPDIR from their
environment. --url names a streamable HTTP endpoint.

Side effects come from each tool's annotations (readOnlyHint: reads, else
writes) unless --side-effects sets them for all. Registering again updates the
entries and keeps their lifecycle state.`,
		Example: `  toolwire tools mcp add fs --command "mcp-server-filesystem /srv/data"
  toolwire tools mcp add search --url https://mcp.example.com/mcp --version 1.1.0 --side-effects reads`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			srv, err := mcpServerFromFlags(args[0], command, url)
			if err != nil {
				return err
			}
			opts := mcp.RegisterOptions{
				Version:     version,
				BareNames:   bare,
				Category:    envelope.Category(category),
				SideEffects: envelope.SideEffects(sideEffects),
				TimeoutMS:   int(toolTimeout / time.Millisecond),
			}
			if err := checkMCPOptions(opts, toolTimeout); err != nil {
				return err
			}
			ctx, cancel := contextWithTimeout(cmd.Context(), timeout)
			defer cancel()
			var r mcp.Registration
			if dryRun {
				r, err = mcp.ToolDefinitions(ctx, srv, opts)
			} else {
				nc, js, cerr := connectCLI(ctx, natsURL)
				if cerr != nil {
					return cerr
				}
				defer nc.Close()
				reg, rerr := registry.Open(ctx, js)
				if rerr != nil {
					return rerr
				}
				r, err = mcp.RegisterServer(ctx, reg, srv, opts)
			}
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			for _, d := range r.Tools {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", d.Ref(), d.Metadata.SideEffects, firstLine(d.Description))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, s := range r.Skipped {
				fmt.Fprintf(cmd.ErrOrStderr(), "skipped %s\n", s)
			}
			verb := "registered"
			if dryRun {
				verb = "would register"
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "%s %d tools of %s\n", verb, len(r.Tools), srv)
			if len(r.Tools) == 0 {
				return errors.New("the server offers no tool that can be registered")
			}
			return nil
		},
	}
	fl := cmd.Flags()
	natsFlag(fl, &natsURL)
	fl.StringVar(&command, "command", "", "a stdio server: program and arguments")
	fl.StringVar(&url, "url", "", "a streamable HTTP server's endpoint")
	fl.StringVar(&version, "version", mcp.DefaultToolVersion, "the version of every registered tool")
	fl.BoolVar(&bare, "bare-names", false, "name entries after the tools alone, without the server's name")
	fl.StringVar(&category, "category", string(envelope.CategoryAPI), "category of every tool: api, code, data, search or utility")
	fl.StringVar(&sideEffects, "side-effects", "", "side effects of every tool: none, reads or writes (default: from each tool's annotations)")
	fl.DurationVar(&toolTimeout, "tool-timeout", 0, "timeout of every tool's calls (default the executor's, 30s)")
	fl.DurationVar(&timeout, "timeout", time.Minute, "how long to wait for the server and the registry")
	fl.BoolVar(&dryRun, "dry-run", false, "list what would be registered without writing the registry")
	return cmd
}

// flagName names an option as the command line gives it.
func flagName(option string) string { return "--" + option }

// mcpServerFromFlags builds the server from the command line.
func mcpServerFromFlags(name, command, url string) (mcp.Server, error) {
	return mcp.ParseServer(name, command, url, flagName)
}

// checkMCPOptions rejects bad flag values before connecting.
func checkMCPOptions(o mcp.RegisterOptions, toolTimeout time.Duration) error {
	var bad error
	if toolTimeout < 0 || (toolTimeout > 0 && toolTimeout < time.Millisecond) {
		bad = fmt.Errorf("--tool-timeout %s: want a positive duration", toolTimeout)
		o.TimeoutMS = 0
	}
	return errors.Join(o.Validate(flagName), bad)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
