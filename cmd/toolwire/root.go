package main

import (
	"github.com/spf13/cobra"
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
	root.AddCommand(newDevCmd(), newRunCmd(), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Run:   func(cmd *cobra.Command, _ []string) { cmd.Println("toolwire", version) },
	})
	return root
}
