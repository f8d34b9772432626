// Command policy runs the Policy Guard service.
package main

import (
	"github.com/toolwire/toolwire/pkg/events/service"
	"github.com/toolwire/toolwire/services/policy"
)

func main() { service.Main("policy", ":8082", policy.Build) }
