package executor_test

import (
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/executor/standard"
	"github.com/toolwire/toolwire/services/executor/tools/web"
)

// The tests of package executor run the executor as its binary does, with
// the standard families, which they cannot import themselves.
func init() {
	executor.SetStandard(standard.WithWebConfig, standard.Build, func(s *executor.Service) web.Config {
		c, _ := standard.ConfigOf(s)
		return c.Web
	})
}
