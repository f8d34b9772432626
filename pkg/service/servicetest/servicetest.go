// Package servicetest holds the checks every service's tests run against the
// shared skeleton of package service.
package servicetest

import (
	"reflect"
	"testing"

	"github.com/toolwire/toolwire/pkg/service"
)

// VarsTakeEffect checks a service's documented environment variables against
// its ConfigFromEnv: every variable has help text and an example, the example
// is accepted, and it changes the configuration (a variable that is read but
// changes nothing is as good as undocumented). Each is tried alone.
func VarsTakeEffect[C any](t *testing.T, vars []service.Var, fromEnv func(getenv func(string) string) (C, error)) {
	t.Helper()
	base, err := fromEnv(func(string) string { return "" })
	if err != nil {
		t.Fatalf("the empty environment is refused: %v", err)
	}
	seen := map[string]bool{}
	for _, v := range vars {
		if v.Name == "" || v.Help == "" || v.Example == "" {
			t.Errorf("variable %+v: name, help and example are required", v)
			continue
		}
		if seen[v.Name] {
			t.Errorf("variable %s is listed twice", v.Name)
		}
		seen[v.Name] = true
		got, err := fromEnv(func(k string) string {
			if k == v.Name {
				return v.Example
			}
			return ""
		})
		if err != nil {
			t.Errorf("%s=%q (its documented example) is refused: %v", v.Name, v.Example, err)
			continue
		}
		if reflect.DeepEqual(base, got) {
			t.Errorf("%s=%q changes nothing in the configuration", v.Name, v.Example)
		}
	}
}
