package consume

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
)

// Dead letters. A Runner moves an event that still fails after its consumer's
// MaxDeliver attempts (or at once, for a Permanent error or an undecodable
// message) to the TOOLWIRE_DLQ stream, on toolwire.dlq.<stream>.<durable>,
// with its original headers and body and the Toolwire-Dlq-* headers: where it
// came from, how many deliveries it had, the last error, when it was moved,
// and the failure history (every failed attempt the dead-lettering replica
// saw: its number, time and error). An operator lists and inspects dead
// letters, and replays one once its cause is fixed: ReplayDeadLetter
// publishes it again on its original subject, with its original headers and
// body and a new Nats-Msg-Id, then deletes it from the dead-letter stream.
//
// A replayed event reaches every consumer of its subject again, not only the
// one that failed it: handlers are idempotent (delivery is at least once), so
// the others find it handled and change nothing.

// HeaderDLQHistory holds a dead letter's failure history: a JSON array of
// DeliveryFailure.
const HeaderDLQHistory = "Toolwire-Dlq-History"

// Headers of a dead letter too large for a message of its own: the original
// message (headers and body, JSON) is the object HeaderDLQBodyObject names in
// ObjectDeadLetters, of HeaderDLQBodyBytes bytes with HeaderDLQBodySHA256;
// HeaderDLQBodyTruncated marks one whose object could not be stored, which
// keeps what fit of its body.
const (
	HeaderDLQBodyObject    = "Toolwire-Dlq-Body-Object"
	HeaderDLQBodyBytes     = "Toolwire-Dlq-Body-Bytes"
	HeaderDLQBodySHA256    = "Toolwire-Dlq-Body-Sha256"
	HeaderDLQBodyTruncated = "Toolwire-Dlq-Body-Truncated"
)

// storedMsg is an original message kept in ObjectDeadLetters.
type storedMsg struct {
	Header nats.Header `json:"header"`
	Data   []byte      `json:"data"`
}

// DeadLetterObjectName names the object of an oversized dead letter.
func DeadLetterObjectName(stream, consumer string, seq uint64) string {
	return stream + "." + consumer + "." + strconv.FormatUint(seq, 10)
}

// Limits of the failure history.
const (
	maxHistoryEntries = 16
	maxHistoryError   = 500
	maxTrackedFailing = 4096
)

// DeliveryFailure is one failed delivery of an event.
type DeliveryFailure struct {
	Attempt uint64    `json:"attempt"`
	At      time.Time `json:"at"`
	Error   string    `json:"error"`
}

// failureLog remembers the failed attempts of the messages a runner is
// retrying, by stream sequence, until they succeed or are dead-lettered. It is
// bounded: past maxTrackedFailing messages, the oldest are forgotten (their
// dead letters then carry a shorter history).
type failureLog struct {
	mu    sync.Mutex
	bySeq map[uint64][]DeliveryFailure
	order []uint64
}

func (l *failureLog) add(seq, attempt uint64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bySeq == nil {
		l.bySeq = map[uint64][]DeliveryFailure{}
	}
	if _, ok := l.bySeq[seq]; !ok {
		l.order = append(l.order, seq)
		for len(l.order) > maxTrackedFailing {
			delete(l.bySeq, l.order[0])
			l.order = l.order[1:]
		}
	}
	h := append(l.bySeq[seq], DeliveryFailure{Attempt: attempt, At: time.Now().UTC(), Error: truncate(err.Error(), maxHistoryError)})
	if len(h) > maxHistoryEntries {
		h = h[len(h)-maxHistoryEntries:]
	}
	l.bySeq[seq] = h
}

// take returns and forgets the history of seq.
func (l *failureLog) take(seq uint64) []DeliveryFailure {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.bySeq[seq]
	if !ok {
		return nil
	}
	delete(l.bySeq, seq)
	for i, s := range l.order {
		if s == seq {
			l.order = append(l.order[:i], l.order[i+1:]...)
			break
		}
	}
	return h
}

// historyHeader renders a failure history (with the final failure) for the
// dead letter's header.
func historyHeader(h []DeliveryFailure, final DeliveryFailure) string {
	h = append(h, final)
	if len(h) > maxHistoryEntries {
		h = h[len(h)-maxHistoryEntries:]
	}
	b, err := json.Marshal(h)
	if err != nil {
		return "[]"
	}
	return string(b)
}

// DeadLetter is one message of the dead-letter stream.
type DeadLetter struct {
	// Seq is its sequence in TOOLWIRE_DLQ: what show and replay take.
	Seq uint64 `json:"seq"`
	// Subject, Stream, Consumer and StreamSeq say where it failed.
	Subject   string `json:"subject"`
	Stream    string `json:"stream"`
	Consumer  string `json:"consumer"`
	StreamSeq uint64 `json:"stream_seq"`
	// Deliveries is how many times it was delivered before it was moved.
	Deliveries uint64 `json:"deliveries"`
	// Error is the last failure; History every failure the dead-lettering
	// replica saw, oldest first (the last is Error).
	Error   string            `json:"error"`
	History []DeliveryFailure `json:"history"`
	// DeadAt is when it was moved here.
	DeadAt time.Time `json:"dead_at"`
	// EventID and EventType are the CloudEvent's id and type, when it has
	// them.
	EventID   string `json:"event_id,omitempty"`
	EventType string `json:"event_type,omitempty"`
	// Header holds the original headers (without the Toolwire-Dlq-* ones);
	// Data is the original body. For a dead letter too large for a message,
	// they are loaded from its object (LoadDeadLetter) or, when that could
	// not be stored, Data holds what fit and Truncated is set.
	Header nats.Header `json:"header"`
	Data   []byte      `json:"data"`
	// Object names the object in ObjectDeadLetters that holds the original
	// message of an oversized dead letter; Bytes and SHA256 describe it.
	Object    string `json:"object,omitempty"`
	Bytes     int    `json:"bytes,omitempty"`
	SHA256    string `json:"sha256,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
}

// ErrDeadLetterNotFound is wrapped when the dead-letter stream has no message
// at a sequence.
var ErrDeadLetterNotFound = errors.New("dead letter not found")

// DeadLetterOf reads a dead-letter stream message.
func DeadLetterOf(m *jetstream.RawStreamMsg) DeadLetter {
	d := DeadLetter{Seq: m.Sequence, Header: nats.Header{}, Data: m.Data}
	for k, v := range m.Header {
		if !strings.HasPrefix(strings.ToLower(k), "toolwire-dlq-") {
			d.Header[k] = v
		}
	}
	d.Subject = m.Header.Get(HeaderDLQSubject)
	d.Stream = m.Header.Get(HeaderDLQStream)
	d.Consumer = m.Header.Get(HeaderDLQConsumer)
	d.StreamSeq, _ = strconv.ParseUint(m.Header.Get(HeaderDLQStreamSeq), 10, 64)
	d.Deliveries, _ = strconv.ParseUint(m.Header.Get(HeaderDLQDeliveries), 10, 64)
	d.Error = m.Header.Get(HeaderDLQError)
	d.Object = m.Header.Get(HeaderDLQBodyObject)
	d.Bytes, _ = strconv.Atoi(m.Header.Get(HeaderDLQBodyBytes))
	d.SHA256 = m.Header.Get(HeaderDLQBodySHA256)
	d.Truncated = m.Header.Get(HeaderDLQBodyTruncated) == "true"
	if t, err := time.Parse(time.RFC3339Nano, m.Header.Get(HeaderDLQTime)); err == nil {
		d.DeadAt = t
	} else {
		d.DeadAt = m.Time.UTC()
	}
	if h := m.Header.Get(HeaderDLQHistory); h != "" {
		_ = json.Unmarshal([]byte(h), &d.History)
	}
	if d.History == nil {
		d.History = []DeliveryFailure{}
	}
	d.EventID = events.HeaderCarrier(m.Header).Get(events.HeaderPrefix + "id")
	d.EventType = events.HeaderCarrier(m.Header).Get(events.HeaderPrefix + "type")
	if d.EventID == "" {
		// Structured mode: the attributes are in the body.
		var ce struct {
			ID   string `json:"id"`
			Type string `json:"type"`
		}
		if json.Unmarshal(m.Data, &ce) == nil {
			d.EventID, d.EventType = ce.ID, ce.Type
		}
	}
	return d
}

// DeadLetterFilter selects dead letters. Empty fields match everything.
type DeadLetterFilter struct {
	Stream   string // the stream the event failed in
	Consumer string // the durable that failed it
	// Limit bounds the result (0: no limit).
	Limit int
}

func (f DeadLetterFilter) subject() string {
	switch {
	case f.Stream != "" && f.Consumer != "":
		return DLQSubject(f.Stream, f.Consumer)
	case f.Stream != "":
		return events.Prefix + ".dlq." + f.Stream + ".*"
	case f.Consumer != "":
		return events.Prefix + ".dlq.*." + f.Consumer
	}
	return events.SubjectsDLQ
}

// ListDeadLetters returns the dead letters that match f, oldest first.
func ListDeadLetters(ctx context.Context, js jetstream.JetStream, f DeadLetterFilter) ([]DeadLetter, error) {
	for _, tok := range []string{f.Stream, f.Consumer} {
		if strings.ContainsAny(tok, ".*> \t") {
			return nil, fmt.Errorf("dead letters: %q is not a stream or consumer name", tok)
		}
	}
	s, err := js.Stream(ctx, events.StreamDLQ)
	if err != nil {
		return nil, fmt.Errorf("dead-letter stream: %w", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("dead-letter stream: %w", err)
	}
	out := []DeadLetter{}
	if info.State.Msgs == 0 {
		return out, nil
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{f.subject()}})
	if err != nil {
		return nil, fmt.Errorf("dead letters: %w", err)
	}
	for f.Limit <= 0 || len(out) < f.Limit {
		batch, err := c.FetchNoWait(256)
		if err != nil {
			return nil, fmt.Errorf("dead letters: %w", err)
		}
		n, last := 0, false
		for m := range batch.Messages() {
			n++
			meta, err := m.Metadata()
			if err != nil {
				return nil, fmt.Errorf("dead letters: %w", err)
			}
			raw := &jetstream.RawStreamMsg{Subject: m.Subject(), Sequence: meta.Sequence.Stream, Header: m.Headers(),
				Data: m.Data(), Time: meta.Timestamp}
			if f.Limit <= 0 || len(out) < f.Limit {
				out = append(out, DeadLetterOf(raw))
			}
			last = meta.NumPending == 0
		}
		if err := batch.Error(); err != nil {
			return nil, fmt.Errorf("dead letters: %w", err)
		}
		if n == 0 || last {
			break
		}
	}
	return out, nil
}

// bodySHA256 is what HeaderDLQBodySHA256 holds: the hex SHA-256 of a dead
// letter's stored body, set by the runner and checked by LoadDeadLetter.
func bodySHA256(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// LoadDeadLetter fills the headers and body of an oversized dead letter from
// its object, checking its size and hash; other dead letters are returned as
// they are.
func LoadDeadLetter(ctx context.Context, js jetstream.JetStream, d DeadLetter) (DeadLetter, error) {
	if d.Object == "" {
		return d, nil
	}
	obs, err := js.ObjectStore(ctx, provision.ObjectDeadLetters)
	if err != nil {
		return d, fmt.Errorf("dead letter %d: object store %s: %w", d.Seq, provision.ObjectDeadLetters, err)
	}
	b, err := obs.GetBytes(ctx, d.Object)
	if err != nil {
		return d, fmt.Errorf("dead letter %d: object %s: %w", d.Seq, d.Object, err)
	}
	if len(b) != d.Bytes || bodySHA256(b) != d.SHA256 {
		return d, fmt.Errorf("dead letter %d: object %s does not match it: %d bytes, want %d with sha256 %s", d.Seq, d.Object, len(b), d.Bytes, d.SHA256)
	}
	var sm storedMsg
	if err := json.Unmarshal(b, &sm); err != nil {
		return d, fmt.Errorf("dead letter %d: object %s: %w", d.Seq, d.Object, err)
	}
	d.Header, d.Data = sm.Header, sm.Data
	return d, nil
}

// GetDeadLetter returns the dead letter at seq in the dead-letter stream.
func GetDeadLetter(ctx context.Context, js jetstream.JetStream, seq uint64) (DeadLetter, error) {
	s, err := js.Stream(ctx, events.StreamDLQ)
	if err != nil {
		return DeadLetter{}, fmt.Errorf("dead-letter stream: %w", err)
	}
	m, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return DeadLetter{}, fmt.Errorf("%w: no message %d in %s (replayed, or never there)", ErrDeadLetterNotFound, seq, events.StreamDLQ)
	}
	if err != nil {
		return DeadLetter{}, fmt.Errorf("dead letter %d: %w", seq, err)
	}
	return DeadLetterOf(m), nil
}

// copyEventHeaders copies a stored message's headers into a new message (a
// dead letter, or the replay of one), leaving out what JetStream acts on
// when it stores a message: every "Nats-" header (its id, the conditions of
// its publish such as Nats-Expected-Last-Subject-Sequence, a TTL, a rollup,
// a counter increment, a batch, a schedule), in any spelling. Copied, they
// would apply again to the copy: a dead letter refused because its subject
// is not where the original's was (and the message redelivered for ever), a
// dead letter expiring with the original's TTL, a replay refused beside the
// original.
func copyEventHeaders(dst, src nats.Header) {
	for k, v := range src {
		if len(k) >= len(natsHeaderPrefix) && strings.EqualFold(k[:len(natsHeaderPrefix)], natsHeaderPrefix) {
			continue
		}
		dst[k] = v
	}
}

const natsHeaderPrefix = "Nats-"

// ReplayedMsgID is the Nats-Msg-Id a replayed dead letter is published with:
// new, so that the stream takes it although it holds the original, and
// deterministic, so that a replay retried after a crash is one replay.
func ReplayedMsgID(d DeadLetter) string {
	id := d.EventID
	if id == "" {
		id = d.Stream + "/" + strconv.FormatUint(d.StreamSeq, 10)
	}
	return id + "/replay/" + strconv.FormatUint(d.Seq, 10)
}

// Replayed says where a replayed dead letter went.
type Replayed struct {
	DeadLetter DeadLetter `json:"dead_letter"`
	MsgID      string     `json:"msg_id"`
	Stream     string     `json:"stream"`
	Seq        uint64     `json:"seq"`
	Duplicate  bool       `json:"duplicate"` // already replayed (the stream dropped this publish)
}

// ReplayDeadLetter publishes the dead letter at seq again on its original
// subject, with its original headers and body and a new Nats-Msg-Id
// (ReplayedMsgID), waits for the PubAck, then deletes it from the dead-letter
// stream.
func ReplayDeadLetter(ctx context.Context, js jetstream.JetStream, seq uint64) (Replayed, error) {
	d, err := GetDeadLetter(ctx, js, seq)
	if err != nil {
		return Replayed{}, err
	}
	if d.Subject == "" || strings.HasPrefix(d.Subject, events.Prefix+".dlq.") {
		return Replayed{DeadLetter: d}, fmt.Errorf("dead letter %d names no original subject (header %s)", seq, HeaderDLQSubject)
	}
	if d.Truncated {
		return Replayed{DeadLetter: d}, fmt.Errorf("dead letter %d kept only %d bytes of its body (its object could not be stored): it cannot be replayed", seq, len(d.Data))
	}
	if d, err = LoadDeadLetter(ctx, js, d); err != nil {
		return Replayed{DeadLetter: d}, err
	}
	m := nats.NewMsg(d.Subject)
	copyEventHeaders(m.Header, d.Header)
	id := ReplayedMsgID(d)
	m.Header.Set(events.HeaderMsgID, id)
	m.Data = d.Data
	ack, err := js.PublishMsg(ctx, m)
	if err != nil {
		return Replayed{DeadLetter: d}, fmt.Errorf("replay dead letter %d on %s: %w", seq, d.Subject, err)
	}
	r := Replayed{DeadLetter: d, MsgID: id, Stream: ack.Stream, Seq: ack.Sequence, Duplicate: ack.Duplicate}
	s, err := js.Stream(ctx, events.StreamDLQ)
	if err != nil {
		return r, fmt.Errorf("dead-letter stream: %w", err)
	}
	if err := s.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return r, fmt.Errorf("replayed dead letter %d, but could not delete it: %w", seq, err)
	}
	if d.Object != "" {
		if obs, err := js.ObjectStore(ctx, provision.ObjectDeadLetters); err == nil {
			_ = obs.Delete(ctx, d.Object) // the dead letter is gone; its object is garbage now
		}
	}
	return r, nil
}

// ReplayAudit is the record of one replay of a dead letter: what it was,
// why and by whom it was replayed, when, and where it went.
type ReplayAudit struct {
	Seq       uint64 `json:"seq"`
	Subject   string `json:"subject"`
	Stream    string `json:"stream"`
	Consumer  string `json:"consumer"`
	EventID   string `json:"event_id,omitempty"`
	EventType string `json:"event_type,omitempty"`
	// Error is the failure that dead-lettered it.
	Error  string    `json:"error"`
	Reason string    `json:"reason"`
	By     string    `json:"by"`
	At     time.Time `json:"at"`
	// MsgID, ReplayedStream and ReplayedSeq say where the replay went;
	// Duplicate that it had been replayed already.
	MsgID          string `json:"msg_id"`
	ReplayedStream string `json:"replayed_stream"`
	ReplayedSeq    uint64 `json:"replayed_seq"`
	Duplicate      bool   `json:"duplicate,omitempty"`
}

// ErrNoReason is ReplayDeadLetterAs's error for a replay without a reason.
var ErrNoReason = errors.New("a replay needs a reason: it is recorded with who replayed what and when")

// maxReplayReason bounds a replay's reason.
const maxReplayReason = 1000

// ReplayDeadLetterAs is ReplayDeadLetter by who, for reason (required, at
// most 1000 characters), recorded in provision.BucketDLQAudit: a replay
// that cannot be recorded is an error saying so (the event went).
func ReplayDeadLetterAs(ctx context.Context, js jetstream.JetStream, seq uint64, reason, by string) (Replayed, error) {
	reason = strings.TrimSpace(reason)
	switch {
	case reason == "":
		return Replayed{}, ErrNoReason
	case len(reason) > maxReplayReason:
		return Replayed{}, fmt.Errorf("a replay's reason is at most %d bytes, not %d", maxReplayReason, len(reason))
	case strings.TrimSpace(by) == "":
		return Replayed{}, errors.New("a replay needs who replays it")
	}
	kv, err := js.KeyValue(ctx, provision.BucketDLQAudit)
	if err != nil {
		return Replayed{}, fmt.Errorf("replay audit: %w (provision the streams: toolwire provision)", err)
	}
	r, err := ReplayDeadLetter(ctx, js, seq)
	if err != nil {
		return r, err
	}
	d := r.DeadLetter
	a := ReplayAudit{Seq: seq, Subject: d.Subject, Stream: d.Stream, Consumer: d.Consumer, EventID: d.EventID, EventType: d.EventType,
		Error: d.Error, Reason: reason, By: by, At: time.Now().UTC(), MsgID: r.MsgID, ReplayedStream: r.Stream, ReplayedSeq: r.Seq,
		Duplicate: r.Duplicate}
	b, err := json.Marshal(a)
	if err != nil {
		return r, err
	}
	key := fmt.Sprintf("%020d.%d", a.At.UnixNano(), seq)
	if _, err := kv.Create(ctx, key, b); err != nil {
		return r, fmt.Errorf("replayed dead letter %d, but its audit record could not be written: %w", seq, err)
	}
	return r, nil
}

// ListReplays returns every recorded replay, oldest first.
func ListReplays(ctx context.Context, js jetstream.JetStream) ([]ReplayAudit, error) {
	kv, err := js.KeyValue(ctx, provision.BucketDLQAudit)
	if err != nil {
		return nil, fmt.Errorf("replay audit: %w", err)
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("replay audit: %w", err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]ReplayAudit, 0, len(keys))
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("replay audit %s: %w", k, err)
		}
		var a ReplayAudit
		if err := json.Unmarshal(e.Value(), &a); err != nil {
			return nil, fmt.Errorf("replay audit %s: %w", k, err)
		}
		out = append(out, a)
	}
	return out, nil
}
