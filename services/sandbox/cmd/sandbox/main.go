// Command sandbox runs toolwire's sandbox service as its own process: it runs
// the code of sandbox jobs in gVisor (runsc) or bubblewrap, configured by the
// TOOLWIRE_SANDBOX_* environment (docs/sandbox.md, Runtimes; docs/operations.md,
// Environment; sandbox.EnvVars).
package main

import (
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/sandbox"
)

func main() { service.Main("sandbox", ":8084", service.Builder(sandbox.Build)) }
