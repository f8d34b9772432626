package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/toolwire/toolwire/pkg/events"
)

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "toolwire",
		Short:         "toolwire: a runtime for LLM agent tools over NATS JetStream",
		Long:          "toolwire: a runtime for LLM agent tools over NATS JetStream.\n\n" + exitCodesHelp,
		Version:       buildVersion(), // version.go; --version prints it
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newCallCmd())
	root.AddCommand(newBenchCmd())
	root.AddCommand(newToolsCmd()) // tools.go: the registry commands and tools_mcp.go's mcp
	root.AddCommand(newSecretsCmd())
	root.AddCommand(newDecisionCmd(events.DecisionApprove), newDecisionCmd(events.DecisionDeny), newDecisionCmd(events.DecisionRevise))
	root.AddCommand(newApprovalsCmd())
	root.AddCommand(newValidateCmd())
	root.AddCommand(newIdentitiesCmd())
	root.AddCommand(newDLQCmd()) // dlq.go
	root.AddCommand(newProvisionCmd())
	root.AddCommand(newReplayCmd()) // replay.go
	root.AddCommand(newTokensCmd()) // tokens.go
	root.AddCommand(newRunsCmd())   // runs.go
	root.AddCommand(newCancelCmd()) // cancel.go
	root.AddCommand(newDevCmd(), newRunCmd(), &cobra.Command{
		Use:   "version",
		Short: "Print the version: the module's, the VCS revision and the Go toolchain of the build",
		Args:  cobra.NoArgs,
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), "toolwire", root.Version) },
	})
	root.SetVersionTemplate("toolwire {{.Version}}\n")
	markUsage(root) // exit.go: bad flags and arguments exit exitUsage
	return root
}
