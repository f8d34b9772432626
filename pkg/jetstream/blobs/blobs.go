// Package blobs keeps oversized tool outputs in the JetStream Object Store
// bucket toolwire_blobs and serves them over HTTP.
//
// The executor stores the full payload of an output larger than its
// max_output_bytes with Put and puts the returned attachment (kind blob) in
// the envelope. The attachment's url is relative, "/v1/blobs/<name>": the
// recorder's API (and toolwire dev's HTTP server) serves it with Handler.
// Blob names are single path segments of letters, digits, '.', '_' and '-'.
package blobs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/direct"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
)

// URLPrefix is the path under which blobs are served; a blob's url is
// URLPrefix + name.
const URLPrefix = "/v1/blobs/"

// DefaultContentType is the content type of a blob stored without one.
const DefaultContentType = "application/octet-stream"

// maxNameLen bounds a blob name.
const maxNameLen = 200

var (
	// ErrNotFound is returned by Get for a name that holds no blob.
	ErrNotFound = errors.New("blob not found")
	// ErrInvalidName is returned for a name that is not a safe path segment.
	ErrInvalidName = errors.New("invalid blob name")
)

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// ValidateName checks that name is a blob name: 1 to 200 letters, digits,
// '.', '_' or '-', starting with a letter or digit.
func ValidateName(name string) error {
	if len(name) > maxNameLen || !nameRE.MatchString(name) {
		return fmt.Errorf("%w %q: want 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit", ErrInvalidName, name, maxNameLen)
	}
	return nil
}

// URL returns the relative url of the blob name.
func URL(name string) string { return URLPrefix + name }

func store(ctx context.Context, js jetstream.JetStream) (jetstream.ObjectStore, error) {
	obs, err := js.ObjectStore(ctx, provision.ObjectBlobs)
	if err != nil {
		return nil, fmt.Errorf("object store %s: %w", provision.ObjectBlobs, err)
	}
	return obs, nil
}

// Put stores data as the blob name (replacing a blob of that name) and
// returns its attachment: kind blob, the url, the content type and the size.
func Put(ctx context.Context, js jetstream.JetStream, name string, data []byte, contentType string) (envelope.Attachment, error) {
	if err := ValidateName(name); err != nil {
		return envelope.Attachment{}, err
	}
	if contentType == "" {
		contentType = DefaultContentType
	}
	obs, err := store(ctx, js)
	if err != nil {
		return envelope.Attachment{}, err
	}
	meta := jetstream.ObjectMeta{Name: name, Headers: nats.Header{}}
	meta.Headers.Set("Content-Type", contentType)
	info, err := obs.Put(ctx, meta, bytes.NewReader(data))
	if err != nil {
		return envelope.Attachment{}, fmt.Errorf("put blob %s: %w", name, err)
	}
	return envelope.Attachment{
		Kind:        envelope.AttachmentBlob,
		URL:         URL(name),
		ContentType: contentType,
		Bytes:       int64(info.Size), //nolint:gosec // sizes of stored objects fit int64
	}, nil
}

// Get returns the blob name and its content type; ErrNotFound when there is
// none. It reads by direct gets (package direct), with no consumer, so a
// client whose account imports only direct gets (a producer's) reads blobs
// too; the content is checked against the object's digest.
func Get(ctx context.Context, js jetstream.JetStream, name string) ([]byte, string, error) {
	if err := ValidateName(name); err != nil {
		return nil, "", err
	}
	stream := "OBJ_" + provision.ObjectBlobs
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, "", fmt.Errorf("object store %s: %w", provision.ObjectBlobs, err)
	}
	meta, err := st.GetLastMsgForSubject(ctx, "$O."+provision.ObjectBlobs+".M."+base64.URLEncoding.EncodeToString([]byte(name)))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, "", fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	if err != nil {
		return nil, "", fmt.Errorf("blob %s: %w", name, err)
	}
	var info jetstream.ObjectInfo
	if err := json.Unmarshal(meta.Data, &info); err != nil {
		return nil, "", fmt.Errorf("blob %s: its description: %w", name, err)
	}
	if info.Deleted {
		return nil, "", fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	chunks := "$O." + provision.ObjectBlobs + ".C." + info.NUID
	data := make([]byte, 0, info.Size)
	for from, n := uint64(1), uint32(0); n < info.Chunks; {
		msgs, _, err := direct.Batch(ctx, js, stream, chunks, from, int(min(info.Chunks-n, direct.MaxBatch)))
		if err != nil {
			return nil, "", fmt.Errorf("read blob %s: %w", name, err)
		}
		if len(msgs) == 0 {
			return nil, "", fmt.Errorf("read blob %s: %d of its %d chunks are stored", name, n, info.Chunks)
		}
		for _, m := range msgs {
			data = append(data, m.Data...)
			from = m.Sequence + 1
			n++
		}
	}
	sum := sha256.Sum256(data)
	if uint64(len(data)) != info.Size || info.Digest != "SHA-256="+base64.URLEncoding.EncodeToString(sum[:]) {
		return nil, "", fmt.Errorf("read blob %s: its content does not match its digest", name)
	}
	return data, contentTypeOf(&info), nil
}

// Exists reports whether the blob name is stored.
func Exists(ctx context.Context, js jetstream.JetStream, name string) (bool, error) {
	if err := ValidateName(name); err != nil {
		return false, err
	}
	obs, err := store(ctx, js)
	if err != nil {
		return false, err
	}
	if _, err := obs.GetInfo(ctx, name); err != nil {
		if errors.Is(notFound(name, err), ErrNotFound) {
			return false, nil
		}
		return false, fmt.Errorf("blob %s: %w", name, err)
	}
	return true, nil
}

func notFound(name string, err error) error {
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	return fmt.Errorf("get blob %s: %w", name, err)
}

func contentTypeOf(info *jetstream.ObjectInfo) string {
	if ct := info.Headers.Get("Content-Type"); ct != "" {
		return ct
	}
	return DefaultContentType
}

// Handler serves GET (and HEAD) /v1/blobs/{name}: the blob's bytes with its
// content type and length, 404 for a name that holds no blob, 400 for a name
// that is not a blob name. Mount it at URLPrefix. Blobs are served inert: no
// sniffing, and a sandboxing Content-Security-Policy, whatever their type.
func Handler(js jetstream.JetStream) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+URLPrefix+"{name}", func(w http.ResponseWriter, r *http.Request) {
		serve(w, r, js, r.PathValue("name"))
	})
	return mux
}

func serve(w http.ResponseWriter, r *http.Request, js jetstream.JetStream, name string) {
	if err := ValidateName(name); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	obs, err := store(ctx, js)
	if err != nil {
		http.Error(w, "blob store unavailable", http.StatusServiceUnavailable)
		return
	}
	res, err := obs.Get(ctx, name)
	if err != nil {
		if errors.Is(err, jetstream.ErrObjectNotFound) {
			http.Error(w, "no blob "+name, http.StatusNotFound)
			return
		}
		http.Error(w, "blob store unavailable", http.StatusServiceUnavailable)
		return
	}
	defer func() { _ = res.Close() }()
	info, err := res.Info()
	if err != nil {
		http.Error(w, "blob store unavailable", http.StatusServiceUnavailable)
		return
	}
	h := w.Header()
	h.Set("Content-Type", contentTypeOf(info))
	h.Set("Content-Length", strconv.FormatUint(info.Size, 10))
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "default-src 'none'; sandbox")
	h.Set("Cache-Control", "private, max-age=3600")
	if info.Digest != "" {
		h.Set("ETag", strconv.Quote(info.Digest))
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	if _, err := io.Copy(w, res); err != nil {
		// The status is sent: cut the response so that the client sees a
		// short body rather than a complete-looking one.
		panic(http.ErrAbortHandler)
	}
}
