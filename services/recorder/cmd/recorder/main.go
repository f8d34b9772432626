// Command recorder runs the recorder service: it records every event in the
// database of DATABASE_URL (Postgres, or a SQLite file) and serves the API
// and the timeline pages on TOOLWIRE_HTTP_ADDR. Configuration comes from the
// environment: docs/operations.md, Environment.
package main

import (
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/recorder"
)

func main() { service.Main("recorder", ":8080", service.Builder(recorder.Build)) }
