package main

import (
	"github.com/spf13/cobra"

	"github.com/toolwire/toolwire/pkg/events"
)

// version is set by the build (-ldflags "-X main.version=...").
var version = "dev"

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "toolwire",
		Short:         "toolwire: a runtime for LLM agent tools over NATS JetStream",
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
	root.AddCommand(newDevCmd(), newRunCmd(), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Run:   func(cmd *cobra.Command, _ []string) { cmd.Println("toolwire", version) },
	})
	return root
}
