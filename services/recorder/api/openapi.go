package api

import (
	_ "embed"
	"net/http"
)

// OpenAPI is the API's OpenAPI 3 document (openapi.yaml), served at
// /v1/openapi.yaml.
//
//go:embed openapi.yaml
var OpenAPI []byte

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/yaml")
	h.Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(OpenAPI)
}
