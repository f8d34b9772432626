package executor

import (
	"context"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/blobs"
)

// Room left in a NATS message for the CloudEvents headers (ce-*, trace
// context, Nats-Msg-Id) and the outcome record around an envelope.
const messageHeadroom = 16 << 10

// OutputContentType is the content type of the blob of a truncated output.
const OutputContentType = "application/json"

// TruncatedOutput is the output of a truncated envelope: still valid JSON, it
// says that the output was cut, how large it was, and carries its first bytes
// as a string. The whole output is the envelope's blob attachment.
type TruncatedOutput struct {
	Truncated bool   `json:"truncated"`
	Bytes     int    `json:"bytes"`
	Preview   string `json:"preview"`
}

// blobName names the blob of a call's output: "<run_id>.<call_id>.output".
func blobName(runID, callID string) string { return runID + "." + callID + ".output" }

// maxMessageBytes is the most a published event may weigh: the server's
// max_payload as the connection learnt it.
func (s *Service) maxMessageBytes() int {
	if nc := s.JS.Conn(); nc != nil {
		if mp := nc.MaxPayload(); mp > 0 {
			return int(mp)
		}
	}
	return 1 << 20 // the NATS default
}

// fits reports whether env, published as a call.completed event, fits in
// one message.
func (s *Service) fits(env *envelope.ToolEnvelope) (bool, error) {
	// An envelope is its input, its output and its error's details, each
	// at most maxEscape times its bytes as the event encodes it, and some
	// small fields: well under the limit, it fits without encoding it.
	if env.Error == nil && boundOf(env) <= s.maxMessageBytes()-messageHeadroom {
		return true, nil
	}
	b, err := json.Marshal(env)
	if err != nil {
		return false, err
	}
	return len(b)+messageHeadroom <= s.maxMessageBytes(), nil
}

// inputRoom refuses, before it runs, a call whose input leaves no room for
// its result: the envelope carries the input, and must fit in one message
// even with an empty output. Run, such a call could not report, and its
// output would be blamed for the room its input took.
func (s *Service) inputRoom(ref envelope.ToolRef, env *envelope.ToolEnvelope) *envelope.ToolError {
	ok, err := s.fits(env)
	if err != nil || ok {
		return nil
	}
	return envelope.NewToolError(envelope.CodeValidation,
		"the input of tool %s (%d bytes) is too large: the call's result carries it, and no result with it fits in one message "+
			"(%d bytes, %d of them kept for the headers)", ref, len(env.Input), s.maxMessageBytes(), messageHeadroom)
}

// maxEscape is the most encoding/json grows a byte of a JSON document: a
// control character, '<', '>', '&' or a byte of invalid UTF-8 inside a string
// becomes a six-byte escape (\u003c), and events are encoded that way.
const maxEscape = 6

// envelopeFields bounds what an envelope without an error holds beside its
// input, output and attachments, encoded: its ids, name, version, times,
// flags and cost, the names and version each at most a few hundred bytes.
const envelopeFields = 4 << 10

// boundOf is the most an envelope without an error can weigh encoded.
func boundOf(env *envelope.ToolEnvelope) int {
	n := (len(env.Input)+len(env.Output)+len(env.Name)+len(env.Version))*maxEscape + envelopeFields
	for _, a := range env.Attachments {
		n += (len(a.Kind)+len(a.URL)+len(a.ContentType))*maxEscape + 64
	}
	return n
}

// setOutput puts out in the envelope, or, when it weighs more than
// MaxOutputBytes as the event encodes it, or its envelope would not fit in
// one message, stores it whole as a blob and puts a TruncatedOutput preview
// and the blob's attachment in its place. Either way the envelope's output
// weighs at most MaxOutputBytes in the event (a preview is cut until it
// does), so that no event grows with the size of a tool's output.
func (s *Service) setOutput(ctx context.Context, runID, callID string, env *envelope.ToolEnvelope, out json.RawMessage) error {
	env.Output = out
	inline, err := s.withinMax(out)
	if err != nil {
		return err
	}
	if inline {
		ok, err := s.fits(env)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
	}
	att, err := blobs.Put(ctx, s.JS, blobName(runID, callID), out, OutputContentType)
	if err != nil {
		return err
	}
	env.Truncated = true
	env.Attachments = append(env.Attachments, att)
	n := min(s.cfg.PreviewBytes, len(out))
	for {
		n = utf8Cut(out, n)
		preview, err := json.Marshal(TruncatedOutput{Truncated: true, Bytes: len(out), Preview: string(out[:n])})
		if err != nil {
			return err
		}
		env.Output = preview
		// Escaped as a JSON string, a preview can weigh up to six times its
		// bytes: it is cut in proportion until it is within MaxOutputBytes
		// (an empty one stands whatever the limit), then halved until the
		// envelope fits in a message.
		if over := len(preview) - s.cfg.MaxOutputBytes; over > 0 && n > 0 {
			n = min(n-1, n*s.cfg.MaxOutputBytes/len(preview))
			continue
		}
		ok, err := s.fits(env)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if n == 0 {
			return fmt.Errorf("the envelope does not fit in one message even without a preview (%d bytes of input)", len(env.Input))
		}
		n /= 2
	}
}

// withinMax reports whether out, encoded as the event encodes it, weighs at
// most MaxOutputBytes. Only an output that escaping could take over the limit
// is encoded to find out.
func (s *Service) withinMax(out json.RawMessage) (bool, error) {
	switch {
	case len(out) > s.cfg.MaxOutputBytes:
		return false, nil
	case len(out) <= s.cfg.MaxOutputBytes/maxEscape:
		return true, nil
	}
	b, err := json.Marshal(out)
	if err != nil {
		return false, err
	}
	return len(b) <= s.cfg.MaxOutputBytes, nil
}

// utf8Cut returns the largest n' <= n such that b[:n'] does not end inside
// a UTF-8 sequence.
func utf8Cut(b []byte, n int) int {
	if n >= len(b) {
		return len(b)
	}
	for n > 0 && !utf8.RuneStart(b[n]) {
		n--
	}
	return n
}
