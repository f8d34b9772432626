package stack

import (
	"net/http"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/events/blobs"
)

// withBlobs serves the blobs of truncated outputs (/v1/blobs/{name}, the url
// of their attachments) beside the recorder's API.
func withBlobs(api http.Handler, js jetstream.JetStream) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(blobs.URLPrefix, blobs.Handler(js))
	mux.Handle("/", api)
	return mux
}
