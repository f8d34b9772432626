// Package web holds the executor's web tools: http_request (any method,
// writes), http_get (reads), web_fetch (a page as Markdown, reads). They
// share one HTTP client (Client) whose dialer refuses loopback, private,
// link-local, metadata and other special-purpose addresses after DNS
// resolution, on every connection (guard.go): a refusal is POLICY_DENIED and
// nothing is sent. Config.AllowHosts (TOOLWIRE_HTTP_ALLOW_HOSTS) names the
// host[:port]s an operator trusts. A secret a call's secret_headers names
// goes only to the hosts, and in the headers, that the registry entry's
// secret_destinations bind it to; anything else is POLICY_DENIED and nothing
// is sent (secretdest.go). The tools of kind http (package httptool) send
// their requests through the same client (Client.Do), with the same header
// checks (BuildHeaders), their secrets bound to their endpoint
// (EndpointBindings), and the same status mapping (StatusError).
package web

import (
	"time"

	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// Tools returns the web tools, all on client c.
func Tools(c *Client) []toolapi.Tool {
	return []toolapi.Tool{
		httpTool{web: c, now: time.Now},
		httpTool{web: c, getOnly: true, now: time.Now},
		webFetchTool{web: c, now: time.Now},
	}
}
