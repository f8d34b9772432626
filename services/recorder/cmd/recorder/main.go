// Command recorder runs the recorder service: it records every run and tool
// call event in Postgres and serves the read API on TOOLWIRE_HTTP_ADDR.
package main

import (
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/recorder"
)

func main() { service.Main("recorder", ":8080", recorder.Build) }
