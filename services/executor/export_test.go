package executor

import (
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/executor/tools/web"
)

// std is what the tests of this package need of package standard, which
// they cannot import (it imports this package): standard_test.go, of
// package executor_test in the same test binary, sets it (SetStandard)
// before any test runs.
var std struct {
	// withWeb gives an executor the standard families, with these web
	// settings (standard.WithWebConfig).
	withWeb func(web.Config) Option
	// build is standard.Build.
	build func(service.Deps, ...Option) (*Service, error)
	// webOf returns the web settings of s's standard families.
	webOf func(s *Service) web.Config
}

// SetStandard sets std.
func SetStandard(withWeb func(web.Config) Option, build func(service.Deps, ...Option) (*Service, error), webOf func(*Service) web.Config) {
	std.withWeb, std.build, std.webOf = withWeb, build, webOf
}

// withStandard gives an executor the standard families, as the executor
// binary has them (the built-ins, the web tools, the http, mcp and sandbox
// kinds), with the default settings.
func withStandard() Option { return std.withWeb(web.Config{}) }
