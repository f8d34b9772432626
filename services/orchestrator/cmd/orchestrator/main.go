// Command orchestrator runs toolwire's agent loop as its own process.
// Configuration comes from the environment: docs/operations.md, Environment.
package main

import (
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/orchestrator"
)

func main() { service.Main("orchestrator", ":8081", service.Builder(orchestrator.Build)) }
