package blobs_test

import (
	"bytes"
	"crypto/rand"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/blobs"
)

func TestMain(m *testing.M) {
	// nats.go v1.55.0: the object store's Put clears the publisher's status
	// channel while this goroutine waits on it, so it can wait forever (a
	// client-library race, jetstream/object.go and publish.go; not ours).
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"))
}

func TestPutGetServe(t *testing.T) {
	env := eventstest.Start(t)
	big := make([]byte, 5<<20+123) // 5 MiB and change: many chunks
	_, err := rand.Read(big)
	require.NoError(t, err)

	att, err := blobs.Put(t.Context(), env.JS, "run-1.abc123.output", big, "application/json")
	require.NoError(t, err)
	require.Equal(t, envelope.Attachment{Kind: envelope.AttachmentBlob, URL: "/v1/blobs/run-1.abc123.output", ContentType: "application/json", Bytes: int64(len(big))}, att)

	got, ct, err := blobs.Get(t.Context(), env.JS, "run-1.abc123.output")
	require.NoError(t, err)
	require.Equal(t, "application/json", ct)
	require.True(t, bytes.Equal(big, got), "the blob comes back whole")

	ok, err := blobs.Exists(t.Context(), env.JS, "run-1.abc123.output")
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = blobs.Exists(t.Context(), env.JS, "nope")
	require.NoError(t, err)
	require.False(t, ok)

	_, err = blobs.Put(t.Context(), env.JS, "small", []byte("hi"), "")
	require.NoError(t, err)
	_, ct, err = blobs.Get(t.Context(), env.JS, "small")
	require.NoError(t, err)
	require.Equal(t, blobs.DefaultContentType, ct)

	_, _, err = blobs.Get(t.Context(), env.JS, "missing")
	require.ErrorIs(t, err, blobs.ErrNotFound)

	srv := httptest.NewServer(blobs.Handler(env.JS))
	t.Cleanup(srv.Close)

	tests := []struct {
		name, method, path string
		status             int
		body               []byte
		contentType        string
	}{
		{name: "whole blob", method: http.MethodGet, path: att.URL, status: http.StatusOK, body: big, contentType: "application/json"},
		{name: "head", method: http.MethodHead, path: att.URL, status: http.StatusOK, body: []byte{}, contentType: "application/json"},
		{name: "default type", method: http.MethodGet, path: "/v1/blobs/small", status: http.StatusOK, body: []byte("hi"), contentType: blobs.DefaultContentType},
		{name: "unknown", method: http.MethodGet, path: "/v1/blobs/missing", status: http.StatusNotFound},
		{name: "bad name", method: http.MethodGet, path: "/v1/blobs/.hidden", status: http.StatusBadRequest},
		{name: "nested path", method: http.MethodGet, path: "/v1/blobs/a/b", status: http.StatusNotFound},
		{name: "post", method: http.MethodPost, path: att.URL, status: http.StatusMethodNotAllowed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), tc.method, srv.URL+tc.path, nil)
			require.NoError(t, err)
			resp, err := srv.Client().Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, tc.status, resp.StatusCode, "%s", body)
			if tc.status != http.StatusOK {
				return
			}
			require.Equal(t, tc.contentType, resp.Header.Get("Content-Type"))
			require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
			require.NotEmpty(t, resp.Header.Get("ETag"))
			require.True(t, bytes.Equal(tc.body, body), "body of %d bytes, want %d", len(body), len(tc.body))
		})
	}
}

func TestNames(t *testing.T) {
	for _, ok := range []string{"a", "run-1.0123abcd.output", "A_b-c.d", string(bytes.Repeat([]byte("x"), 200))} {
		require.NoError(t, blobs.ValidateName(ok), ok)
	}
	for _, bad := range []string{"", ".x", "-x", "a/b", "a b", "a%2fb", "é", "../etc", string(bytes.Repeat([]byte("x"), 201))} {
		require.ErrorIs(t, blobs.ValidateName(bad), blobs.ErrInvalidName, bad)
	}
	env := eventstest.Start(t)
	_, err := blobs.Put(t.Context(), env.JS, "a/b", []byte("x"), "")
	require.ErrorIs(t, err, blobs.ErrInvalidName)
	_, _, err = blobs.Get(t.Context(), env.JS, "../x")
	require.ErrorIs(t, err, blobs.ErrInvalidName)
	require.Equal(t, "/v1/blobs/x", blobs.URL("x"))
}
