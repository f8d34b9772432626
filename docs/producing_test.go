package docs_test

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"encoding/base32"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/service/identity"
)

// recipe is the example of docs/producing.md: the request's body (its json
// block), and the subject and headers of its `nats request` command.
type recipe struct {
	body    []byte
	subject string
	headers [][2]string
}

func readRecipe(t *testing.T) recipe {
	t.Helper()
	doc := readDoc(t, "docs/producing.md")
	body := regexp.MustCompile("(?s)```json\n(.*?)```").FindStringSubmatch(doc)
	require.NotNil(t, body, "docs/producing.md has no json block")
	cmd := regexp.MustCompile("(?s)```sh\n(.*?)```").FindStringSubmatch(doc)
	require.NotNil(t, cmd, "docs/producing.md has no sh block")
	r := recipe{body: []byte(body[1])}
	subj := regexp.MustCompile(`request (\S+) "\$\(cat request\.json\)"`).FindStringSubmatch(cmd[1])
	require.NotNil(t, subj, "the sh block has no `request <subject> \"$(cat request.json)\"`")
	r.subject = subj[1]
	for _, m := range regexp.MustCompile(`-H (\S+)`).FindAllStringSubmatch(cmd[1], -1) {
		k, v, ok := strings.Cut(m[1], ":")
		require.True(t, ok, "header %q is not K:V", m[1])
		r.headers = append(r.headers, [2]string{k, v})
	}
	require.Contains(t, cmd[1], "--inbox-prefix "+identity.Producer.InboxPrefix()+" ")
	return r
}

func (r recipe) msg() *nats.Msg {
	m := nats.NewMsg(r.subject)
	for _, h := range r.headers {
		m.Header[h[0]] = []string{h[1]}
	}
	m.Data = r.body
	return m
}

// pubAck is JetStream's answer to a publish.
type pubAck struct {
	Stream    string `json:"stream"`
	Seq       uint64 `json:"seq"`
	Duplicate bool   `json:"duplicate"`
	Error     *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
}

func parseAck(t *testing.T, b []byte) pubAck {
	t.Helper()
	var a pubAck
	require.NoError(t, json.Unmarshal(b, &a), "%s", b)
	return a
}

// TestProducingRecipe: the run request of docs/producing.md, its headers and
// body as written there, published by the producer identity (in its own
// account, as `toolwire dev` runs it) is stored and is a run request the
// orchestrator takes; a resubmit gets the duplicate's PubAck, and past the
// duplicate window (another Nats-Msg-Id stands for it) error 10071; the same
// request in the raw NATS protocol, signed with the seed by the standard
// library alone, is stored too; an intake is stored without the condition;
// and the producer reads the run back by the direct gets the page describes.
func TestProducingRecipe(t *testing.T) {
	r := readRecipe(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	keys, err := identity.LoadOrCreate(t.TempDir())
	require.NoError(t, err)
	srv, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Identities: keys})
	require.NoError(t, err)
	t.Cleanup(func() { embedded.Stop(srv) })
	connect := func(role identity.Role) *nats.Conn {
		opts, err := identity.ConnectOptions(role, keys.SeedFile(role))
		require.NoError(t, err)
		nc, err := nats.Connect(srv.ClientURL(), opts...)
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		return nc
	}
	ops, err := jetstream.New(connect(identity.Operator))
	require.NoError(t, err)
	require.NoError(t, provision.Provision(ctx, ops, provision.StoreConfig{}))
	prod := connect(identity.Producer)

	// Stored, and a run request as the orchestrator and the recorder read it.
	reply, err := prod.RequestMsg(r.msg(), 10*time.Second)
	require.NoError(t, err)
	ack := parseAck(t, reply.Data)
	require.Nil(t, ack.Error, "%s", reply.Data)
	require.Equal(t, events.StreamRuns, ack.Stream)
	require.False(t, ack.Duplicate)
	t.Logf("stored: %s", reply.Data)
	runs, err := ops.Stream(ctx, events.StreamRuns)
	require.NoError(t, err)
	stored, err := runs.GetLastMsgForSubject(ctx, r.subject)
	require.NoError(t, err)
	require.Equal(t, ack.Seq, stored.Sequence)
	e, err := events.Decode(&nats.Msg{Subject: stored.Subject, Header: stored.Header, Data: stored.Data})
	require.NoError(t, err)
	var req envelope.RunRequest
	require.NoError(t, events.DecodeData(e, &req))
	require.NoError(t, req.Validate())
	schemas, err := events.NewSchemas()
	require.NoError(t, err)
	require.NoError(t, schemas.Validate(envelope.SchemaRunRequest, r.body))
	subj, err := events.ParseSubject(r.subject)
	require.NoError(t, err)
	require.Equal(t, req.RunID, subj.RunID)
	require.Equal(t, events.TypeRunRequested, e.Type())
	require.Equal(t, events.RunRequestedID(req.RunID), e.ID(), "the orchestrator takes only this id (services/orchestrator/loop.go)")
	require.Equal(t, e.ID(), stored.Header.Get(events.HeaderMsgID))
	require.Equal(t, req.RunID, events.Ext(e, events.ExtRunID))
	require.Equal(t, req.Tenant.ID(), events.Ext(e, events.ExtTenantID))
	require.Equal(t, envelope.SchemaURL(envelope.SchemaRunRequest), e.DataSchema())
	require.Equal(t, "0", stored.Header.Get(jetstream.ExpectedLastSubjSeqHeader))

	// The same request again, and another request under the run id: the
	// condition refuses both (nats-server checks it before the duplicate
	// window).
	other := r.msg()
	other.Header.Set(events.HeaderMsgID, "another-id")
	other.Data = []byte(strings.Replace(string(r.body), "Paris", "Rome", 1))
	for _, again := range []*nats.Msg{r.msg(), other} {
		reply, err = prod.RequestMsg(again, 10*time.Second)
		require.NoError(t, err)
		refused := parseAck(t, reply.Data)
		require.NotNil(t, refused.Error, "%s", reply.Data)
		require.Equal(t, jetstream.JSErrCodeStreamWrongLastSequence, jetstream.ErrorCode(refused.Error.ErrCode), "%s", reply.Data)
		require.Equal(t, fmt.Sprintf("wrong last sequence: %d", ack.Seq), refused.Error.Description)
		t.Logf("resubmitted (Nats-Msg-Id %s): %s", again.Header.Get(events.HeaderMsgID), reply.Data)
	}
	stored, err = runs.GetLastMsgForSubject(ctx, r.subject)
	require.NoError(t, err)
	require.Equal(t, ack.Seq, stored.Sequence, "nothing more is stored")

	// The raw protocol, another run.
	raw := r
	raw.subject = strings.Replace(r.subject, req.RunID, "run_raw", 1)
	raw.body = []byte(strings.ReplaceAll(string(r.body), req.RunID, "run_raw"))
	raw.headers = nil
	for _, h := range r.headers {
		raw.headers = append(raw.headers, [2]string{h[0], strings.ReplaceAll(h[1], req.RunID, "run_raw")})
	}
	rawAck := parseAck(t, rawPublish(t, srv.ClientURL(), keys.SeedFile(identity.Producer), keys.Public(identity.Producer), raw))
	require.Nil(t, rawAck.Error)
	require.Equal(t, events.StreamRuns, rawAck.Stream)
	require.Greater(t, rawAck.Seq, ack.Seq)

	// The intake: no condition, a Nats-Msg-Id of the producer's.
	in := r.msg()
	in.Subject, err = events.IntakeSubject(req.Tenant, "run_intake")
	require.NoError(t, err)
	in.Data = []byte(strings.ReplaceAll(string(r.body), req.RunID, "run_intake"))
	in.Header.Del(jetstream.ExpectedLastSubjSeqHeader)
	in.Header.Set(events.HeaderMsgID, in.Subject+"/0123456789abcdef0123456789abcdef")
	reply, err = prod.RequestMsg(in, 10*time.Second)
	require.NoError(t, err)
	inAck := parseAck(t, reply.Data)
	require.Nil(t, inAck.Error, "%s", reply.Data)
	require.Equal(t, events.StreamIntake, inAck.Stream)
	require.Equal(t, "toolwire.intake.acme.research.run_intake", in.Subject)
	reply, err = prod.RequestMsg(in, 10*time.Second)
	require.NoError(t, err)
	inAgain := parseAck(t, reply.Data)
	require.Nil(t, inAgain.Error, "%s", reply.Data)
	require.True(t, inAgain.Duplicate, "%s", reply.Data)
	t.Logf("intake resubmitted: %s", reply.Data)

	// Following: a batch direct get, then the last message of a subject,
	// under the producer's JetStream API prefix.
	filter, err := events.RunEvents(req.RunID)
	require.NoError(t, err)
	inbox := prod.NewRespInbox()
	sub, err := prod.SubscribeSync(inbox)
	require.NoError(t, err)
	body, err := json.Marshal(map[string]any{"seq": 1, "next_by_subj": filter, "batch": 256})
	require.NoError(t, err)
	require.NoError(t, prod.PublishRequest(events.ImportedJSAPI+".DIRECT.GET."+events.StreamRuns, inbox, body))
	m, err := sub.NextMsg(10 * time.Second)
	require.NoError(t, err)
	require.Equal(t, strconv.FormatUint(ack.Seq, 10), m.Header.Get(jetstream.SequenceHeader))
	require.Equal(t, r.body, m.Data)
	m, err = sub.NextMsg(10 * time.Second)
	require.NoError(t, err)
	require.Equal(t, "204", m.Header.Get("Status"))
	require.Empty(t, m.Data)
	last, err := prod.Request(events.ImportedJSAPI+".DIRECT.GET."+events.StreamRuns+"."+r.subject, nil, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, r.body, last.Data)
	none, err := prod.Request(events.ImportedJSAPI+".DIRECT.GET."+events.StreamRuns+"."+strings.Replace(r.subject, "requested", "completed", 1), nil, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, "404", none.Header.Get("Status"))
}

// rawPublish publishes r in the NATS protocol over a TCP connection, signed
// in with the seed file as docs/producing.md describes (no NATS library),
// and returns JetStream's answer.
func rawPublish(t *testing.T, url, seedFile, public string, r recipe) []byte {
	t.Helper()
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(url, "nats://"), 5*time.Second)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	require.NoError(t, conn.SetDeadline(time.Now().Add(20*time.Second)))
	rd := bufio.NewReader(conn)
	line, err := rd.ReadString('\n')
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(line, "INFO "), line)
	var info struct {
		Nonce string `json:"nonce"`
	}
	require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(line, "INFO ")), &info))

	// A user seed is base32 (no padding) of two prefix bytes, the 32-byte
	// Ed25519 seed and a CRC-16.
	seed, err := os.ReadFile(filepath.Clean(seedFile))
	require.NoError(t, err)
	rawSeed, err := base32.StdEncoding.WithPadding(base32.NoPadding).DecodeString(strings.TrimSpace(string(seed)))
	require.NoError(t, err)
	require.Len(t, rawSeed, 36)
	sig := ed25519.Sign(ed25519.NewKeyFromSeed(rawSeed[2:34]), []byte(info.Nonce))
	connect, err := json.Marshal(map[string]any{"verbose": false, "headers": true, "nkey": public,
		"sig": base64.RawURLEncoding.EncodeToString(sig)})
	require.NoError(t, err)
	inbox := identity.Producer.InboxPrefix() + ".raw1"
	var hdr strings.Builder
	hdr.WriteString("NATS/1.0\r\n")
	for _, h := range r.headers {
		hdr.WriteString(h[0] + ": " + h[1] + "\r\n")
	}
	hdr.WriteString("\r\n")
	_, err = fmt.Fprintf(conn, "CONNECT %s\r\nSUB %s 1\r\nHPUB %s %s %d %d\r\n%s%s\r\nPING\r\n",
		connect, inbox, r.subject, inbox, hdr.Len(), hdr.Len()+len(r.body), hdr.String(), r.body)
	require.NoError(t, err)
	for {
		line, err := rd.ReadString('\n')
		require.NoError(t, err)
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "PING":
			_, err = conn.Write([]byte("PONG\r\n"))
			require.NoError(t, err)
		case strings.HasPrefix(line, "-ERR"):
			t.Fatalf("the server refused the raw protocol: %s", line)
		case strings.HasPrefix(line, "MSG "):
			f := strings.Fields(line)
			n, err := strconv.Atoi(f[len(f)-1])
			require.NoError(t, err)
			b := make([]byte, n+2)
			_, err = io.ReadFull(rd, b)
			require.NoError(t, err)
			t.Logf("raw protocol: %s -> %s", line, b[:n])
			return b[:n]
		}
	}
}
