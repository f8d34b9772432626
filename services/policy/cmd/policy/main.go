// Command policy runs the Policy Guard service as its own process.
// Configuration comes from the environment: docs/operations.md, Environment.
package main

import (
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/policy"
)

func main() { service.Main("policy", ":8082", service.Builder(policy.Build)) }
