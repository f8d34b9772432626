// Command executor runs toolwire's Tool Executor service as its own process.
// Configuration comes from the environment: docs/operations.md, Environment.
package main

import (
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/executor/standard"
)

func main() { service.Main("executor", ":8083", service.Builder(standard.Build)) }
