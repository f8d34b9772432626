package recorder

import (
	"net/http"

	"github.com/rs/cors"
)

// SelectorModule is the path of the tool selector web component
// (<toolwire-tool-selector>, services/recorder/pages/assets), which a host's
// page loads as an ES module from another origin.
const SelectorModule = "/assets/toolwire-tool-selector.js"

// embeddable lets the pages of origins (Config.CORSOrigins) load the tool
// selector's module and read the catalog it shows, GET /v1/tools, with their
// own bearer token: nothing else answers another origin, no cookie is
// allowed to cross (credentials are not allowed), and only GET (with its
// preflight) and the Authorization header are. Without origins h is as it
// was: browsers refuse every cross-origin read.
func embeddable(h http.Handler, origins []string) http.Handler {
	if len(origins) == 0 {
		return h
	}
	c := cors.New(cors.Options{
		AllowedOrigins:   origins,
		AllowedMethods:   []string{http.MethodGet},
		AllowedHeaders:   []string{"Authorization"},
		AllowCredentials: false,
		MaxAge:           600,
	})
	shared := c.Handler(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/tools" || r.URL.Path == SelectorModule {
			shared.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}
