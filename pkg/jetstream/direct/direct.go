// Package direct reads a stream's messages by batched direct gets: no
// consumer is created, so a client whose account imports only direct gets
// from toolwire's system account (a producer's: docs/operations.md,
// Accounts) reads what it follows and the blobs it fetches this way.
package direct

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/events"
)

// Msg is one stored message.
type Msg struct {
	Subject  string
	Sequence uint64
	Header   nats.Header
	Data     []byte
}

// MaxBatch is the most messages Batch asks for at once.
const MaxBatch = 256

// ErrRead is wrapped when the server answers a direct get with an error.
var ErrRead = errors.New("direct get failed")

// Batch returns up to n (at most MaxBatch) messages of stream whose subjects
// match filter, from sequence from on, in order, and whether more are
// stored past them. Nothing stored is no messages and no error. The wait
// for each answer is bounded by ctx and by js's default API timeout.
func Batch(ctx context.Context, js jetstream.JetStream, stream, filter string, from uint64, n int) ([]Msg, bool, error) {
	if n <= 0 || n > MaxBatch {
		n = MaxBatch
	}
	if from == 0 {
		from = 1
	}
	body, err := json.Marshal(struct {
		Seq        uint64 `json:"seq"`
		NextBySubj string `json:"next_by_subj"`
		Batch      int    `json:"batch"`
	}{from, filter, n})
	if err != nil {
		return nil, false, err
	}
	nc := js.Conn()
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, false, fmt.Errorf("direct get %s: %w", stream, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(APIPrefix(js)+".DIRECT.GET."+stream, inbox, body); err != nil {
		return nil, false, fmt.Errorf("direct get %s: %w", stream, err)
	}
	wait := apiWait(js)
	var out []Msg
	for {
		mctx, cancel := context.WithTimeout(ctx, wait)
		m, err := sub.NextMsgWithContext(mctx)
		cancel()
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, false, fmt.Errorf("%w: %s: no stream answers (is it there, and are direct gets imported?): %w", ErrRead, stream, err)
		}
		if err != nil {
			return nil, false, fmt.Errorf("direct get %s from %d on %s: %w", stream, from, filter, err)
		}
		switch status := m.Header.Get("Status"); status {
		case "":
		case "204": // the end of the batch
			return out, pending(m) > 0, nil
		case "404":
			return out, false, nil
		default:
			return nil, false, fmt.Errorf("%w: %s: %s %s", ErrRead, stream, status, m.Header.Get("Description"))
		}
		seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			return nil, false, fmt.Errorf("%w: %s: message without a sequence", ErrRead, stream)
		}
		out = append(out, Msg{Subject: m.Header.Get(jetstream.SubjectHeader), Sequence: seq, Header: m.Header, Data: m.Data})
	}
}

func pending(m *nats.Msg) uint64 {
	n, _ := strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64)
	return n
}

// APIPrefix is js's JetStream API prefix, without the trailing dot.
func APIPrefix(js jetstream.JetStream) string {
	p := strings.TrimSuffix(js.Options().APIPrefix, ".")
	if p == "" {
		return jetstream.DefaultAPIPrefix[:len(jetstream.DefaultAPIPrefix)-1]
	}
	return p
}

// JetStream returns a JetStream handle on nc for its account: the plain API
// in toolwire's system account (or a server without accounts), and the
// prefix events.ImportedJSAPI in an account without JetStream of its own,
// which imports its reads from the system account (a producer's). It asks
// the server for the account's JetStream once: an account without
// JetStream says so at once; any other outcome (an answer, a JetStream not
// ready yet, no answer within infoWait or ctx) is the plain API, whose
// callers wait for JetStream as they always do.
func JetStream(ctx context.Context, nc *nats.Conn) (jetstream.JetStream, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, infoWait)
	defer cancel()
	if _, err := js.AccountInfo(ctx); errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
		return jetstream.NewWithAPIPrefix(nc, events.ImportedJSAPI)
	}
	return js, nil
}

// infoWait bounds JetStream's question.
const infoWait = 2 * time.Second

// ErrNotStored is wrapped when Last finds no message on its subject.
var ErrNotStored = errors.New("no message stored")

// Last returns the last message of stream on subject (which may hold
// wildcards), read from the stream's leader (a STREAM.MSG.GET, not a direct
// get, which any replica may answer from behind): it sees every publish that
// was acknowledged before it was asked. ErrNotStored when none is. The wait
// is bounded by ctx and by js's default API timeout.
func Last(ctx context.Context, js jetstream.JetStream, stream, subject string) (*Msg, error) {
	body, err := json.Marshal(struct {
		LastBySubj string `json:"last_by_subj"`
	}{subject})
	if err != nil {
		return nil, err
	}
	reply, err := request(ctx, js, "STREAM.MSG.GET."+stream, body)
	if err != nil {
		return nil, fmt.Errorf("read the last message of %s on %s: %w", stream, subject, err)
	}
	var resp struct {
		Error *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
		Message *struct {
			Subject  string `json:"subject"`
			Sequence uint64 `json:"seq"`
			Header   []byte `json:"hdrs"`
			Data     []byte `json:"data"`
		} `json:"message"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return nil, fmt.Errorf("%w: %s: an answer that is not JSON: %w", ErrRead, stream, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrCode == int(jetstream.JSErrCodeMessageNotFound):
		return nil, fmt.Errorf("%s on %s: %w", stream, subject, ErrNotStored)
	case resp.Error != nil:
		return nil, fmt.Errorf("%w: %s: %d %s", ErrRead, stream, resp.Error.Code, resp.Error.Description)
	case resp.Message == nil:
		return nil, fmt.Errorf("%w: %s: an answer without a message", ErrRead, stream)
	}
	out := &Msg{Subject: resp.Message.Subject, Sequence: resp.Message.Sequence, Data: resp.Message.Data}
	if len(resp.Message.Header) > 0 {
		hm, err := nats.DecodeHeadersMsg(resp.Message.Header)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: message %d: its headers: %w", ErrRead, stream, out.Sequence, err)
		}
		out.Header = hm
	}
	return out, nil
}

// apiWait bounds each answer of the JetStream API: js's default timeout,
// else 5s.
func apiWait(js jetstream.JetStream) time.Duration {
	if wait := js.Options().DefaultTimeout; wait > 0 {
		return wait
	}
	return 5 * time.Second
}

// request asks js's JetStream API (under its prefix) api with body, the
// wait bounded by ctx and apiWait.
func request(ctx context.Context, js jetstream.JetStream, api string, body []byte) (*nats.Msg, error) {
	rctx, cancel := context.WithTimeout(ctx, apiWait(js))
	defer cancel()
	return js.Conn().RequestWithContext(rctx, APIPrefix(js)+"."+api, body)
}

// Count returns how many messages stream holds on subjects matching filter
// (which may hold wildcards), as the stream's leader counts them (a
// STREAM.INFO with a subjects filter): it counts every publish that was
// acknowledged before it was asked. The wait is bounded by ctx and by js's
// default API timeout.
func Count(ctx context.Context, js jetstream.JetStream, stream, filter string) (uint64, error) {
	body, err := json.Marshal(struct {
		Filter string `json:"subjects_filter"`
	}{filter})
	if err != nil {
		return 0, err
	}
	reply, err := request(ctx, js, "STREAM.INFO."+stream, body)
	if err != nil {
		return 0, fmt.Errorf("count the messages of %s on %s: %w", stream, filter, err)
	}
	var resp struct {
		Error *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
		Total int `json:"total"`
		State struct {
			Subjects map[string]uint64 `json:"subjects"`
		} `json:"state"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return 0, fmt.Errorf("%w: %s: an answer that is not JSON: %w", ErrRead, stream, err)
	}
	if resp.Error != nil {
		return 0, fmt.Errorf("%w: %s: %d %s", ErrRead, stream, resp.Error.Code, resp.Error.Description)
	}
	if resp.Total > len(resp.State.Subjects) {
		// The server pages subjects past its limit (100,000): more than
		// one filter is meant to match.
		return 0, fmt.Errorf("%w: %s: %d subjects on %s, more than one answer holds", ErrRead, stream, resp.Total, filter)
	}
	var n uint64
	for _, c := range resp.State.Subjects {
		n += c
	}
	return n, nil
}

// RunEnd returns the run's end event (completed or failed) as the runs
// stream's leader holds it (Last), nil when the run has not ended: what a
// service checks before it does anything more for a run that may be over.
func RunEnd(ctx context.Context, js jetstream.JetStream, runID string) (*Msg, error) {
	for _, verb := range events.EndVerbs() {
		subj, err := events.RunSubject(runID, verb)
		if err != nil {
			return nil, err
		}
		m, err := Last(ctx, js, events.StreamRuns, subj)
		switch {
		case err == nil:
			return m, nil
		case !errors.Is(err, ErrNotStored):
			return nil, fmt.Errorf("run %s: its end: %w", runID, err)
		}
	}
	return nil, nil
}
