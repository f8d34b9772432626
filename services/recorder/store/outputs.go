package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/blobs"
)

// A completed run whose outputs are too large for its event names the blob
// holding them instead (events.RunStatus.OutputsBlob, an
// events.OutputsDocument): the store keeps the reference, and whoever serves
// the outputs reads the blob (the API from JetStream's object store).

// BlobReader reads the blob name: the recorder's API reads JetStream's
// object store (package blobs).
type BlobReader func(ctx context.Context, name string) ([]byte, error)

// ErrOutputsInBlob is wrapped by RunOutputs when a run's outputs are in a
// blob and it was given no BlobReader.
var ErrOutputsInBlob = errors.New("the run's outputs are in a blob")

// BlobName is the name of the blob an attachment names: a blob attachment
// whose url is blobs.URLPrefix followed by the name.
func BlobName(a envelope.Attachment) (string, error) {
	if a.Kind != envelope.AttachmentBlob {
		return "", fmt.Errorf("attachment of kind %q, want %q", a.Kind, envelope.AttachmentBlob)
	}
	name, ok := strings.CutPrefix(a.URL, blobs.URLPrefix)
	if !ok {
		return "", fmt.Errorf("blob url %q does not start with %s", truncateText(a.URL, 120), blobs.URLPrefix)
	}
	if err := blobs.ValidateName(name); err != nil {
		return "", err
	}
	return name, nil
}

// RunOutputs returns a run's outputs and pinned handles as its completed
// event gave them: inline, or from the blob it named, read with read. Both
// are nil for a run that has none (yet). Without read, outputs in a blob are
// an error wrapping ErrOutputsInBlob.
func RunOutputs(ctx context.Context, run Run, read BlobReader) (outputs, pinned json.RawMessage, err error) {
	if len(run.OutputsBlob) == 0 || len(run.Outputs) > 0 || len(run.Pinned) > 0 {
		return run.Outputs, run.Pinned, nil
	}
	var att envelope.Attachment
	if err := json.Unmarshal(run.OutputsBlob, &att); err != nil {
		return nil, nil, fmt.Errorf("run %q: outputs_blob: %w", run.RunID, err)
	}
	name, err := BlobName(att)
	if err != nil {
		return nil, nil, fmt.Errorf("run %q: outputs_blob: %w", run.RunID, err)
	}
	if read == nil {
		return nil, nil, fmt.Errorf("%w %s", ErrOutputsInBlob, name)
	}
	b, err := read(ctx, name)
	if err != nil {
		return nil, nil, fmt.Errorf("run %q: outputs blob: %w", run.RunID, err)
	}
	var doc struct {
		Outputs json.RawMessage `json:"outputs"`
		Pinned  json.RawMessage `json:"pinned"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, nil, fmt.Errorf("run %q: outputs blob %s: %w", run.RunID, name, err)
	}
	return doc.Outputs, doc.Pinned, nil
}

func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
