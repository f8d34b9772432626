// Package identity holds who may do what on NATS: the roles of toolwire's
// services, its CLI and upstream producers, each with the subjects it may
// publish to and subscribe on, and the nkey users a nats-server checks them
// with. The table is the one place these permissions are written; the
// embedded server of `toolwire dev`, the production config that `toolwire
// identities` prints and the roles table of docs/operations.md all read it.
//
// An event's subject says who may publish it: the server refuses a forged
// call `completed` from anything but the services that complete calls, an
// approval `decided` from anything but an operator, a run request from
// anything but a producer or an operator. Replies and pull deliveries go to
// each role's own inbox prefix (_INBOX_<role>), so a role cannot read what
// another role's consumers receive.
package identity

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
)

// Role is one kind of NATS client of toolwire.
type Role string

// The roles. Workers (the worker package) are not a role: each has an
// identity of its own (workers.go).
const (
	Orchestrator Role = "orchestrator"
	Policy       Role = "policy"
	Executor     Role = "executor"
	Sandbox      Role = "sandbox"
	Recorder     Role = "recorder"
	Operator     Role = "operator" // the toolwire CLI of a person running toolwire
	Producer     Role = "producer" // an upstream system: asks for runs, follows them
	// Operations is the process serving the dead-letter tools of an
	// operations agent (worker/dlqtools): the dead letters, their replay
	// audit, and replays of the events that announce (operations.go).
	Operations Role = "operations"
)

// SandboxDurable is the name of the sandbox service's durable consumer
// (services/sandbox.Durable; the stack's tests check they agree).
const SandboxDurable = "sandbox"

// ErrUnknownRole is wrapped when a name is not a role.
var ErrUnknownRole = errors.New("unknown NATS role")

// Roles lists every role, in the order of the docs' roles table.
func Roles() []Role {
	return []Role{Orchestrator, Policy, Executor, Sandbox, Recorder, Operator, Producer, Operations}
}

// Parse returns the role named s.
func Parse(s string) (Role, error) {
	r := Role(strings.TrimSpace(s))
	if !slices.Contains(Roles(), r) {
		return "", fmt.Errorf("%w %q: want one of %s", ErrUnknownRole, s, joinRoles(Roles()))
	}
	return r, nil
}

// ForService is the role a service binary connects as: its own name for the
// five services; false for anything else (a worker has an identity of its
// own: Worker; the operations role is a worker's second connection).
func ForService(name string) (Role, bool) {
	r, err := Parse(name)
	return r, err == nil && r != Operator && r != Producer && r != Operations
}

func joinRoles(rs []Role) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = string(r)
	}
	return strings.Join(s, ", ")
}

// InboxPrefix is the prefix of the role's reply subjects (nats.go's
// CustomInboxPrefix): the role may subscribe only under it.
func (r Role) InboxPrefix() string { return "_INBOX_" + string(r) }

// Permissions are the subjects a role may publish to and subscribe on.
type Permissions struct {
	Publish   []string
	Subscribe []string
	// PublishDeny are exceptions to Publish.
	PublishDeny []string
	// Responses: the role answers requests (core NATS request/reply) on a
	// subject it subscribes to; the server lets it publish one reply to
	// each request's reply subject (MaxResponses when set), within a
	// minute (ResponsesFor when set).
	Responses    bool
	MaxResponses int
	ResponsesFor time.Duration
}

// Doc says what the role is, for the docs and the server config.
func (r Role) Doc() string {
	switch r {
	case Orchestrator:
		return "runs the agent loop: consumes run requests (and hands tenant producers' intake over as run requests), turns and call outcomes; hands tenant producers' cancels over; publishes turns, run lifecycle events, the completions of calls the loop rules answer, and runs' deadline timers"
	case Policy:
		return "the Policy Guard: consumes turns and decisions; publishes approved calls, approval requests and POLICY_DENIED completions"
	case Executor:
		return "the executor: consumes approved calls (a worker's queue's too, handing each to the worker); stops the calls of a cancelled run; publishes started and completed calls, sandbox jobs, and the heartbeats of the queues it serves and of the workers; registers the workers' tools"
	case Sandbox:
		return "consumes sandbox jobs, publishes their results; kills the jobs of a cancelled run"
	case Recorder:
		return "reads every stream into the database; follows live the runs its API's clients wait on; publishes the decisions and cancels of the timeline page and the HTTP API, and the requests of runs submitted over HTTP; writes the registry for its admin API"
	case Operator:
		return "the toolwire CLI of the people who run toolwire: everything, including provisioning, deleting and purging streams"
	case Operations:
		return "the process serving an operations agent's dead-letter tools (worker/dlqtools), beside its worker identity: reads and deletes dead letters, writes the replay audit, and replays the events that announce what happened; never a command (a run request or cancel, an approved call, a decision, a sandbox job: those an operator replays), never another stream"
	case Producer:
		return "an upstream system trusted with every tenant: publishes run requests and cancels (directly or on any tenant's intake), follows its runs' events and reads their outputs; a producer limited to one tenant is a tenant identity (toolwire identities --tenant)"
	}
	return ""
}

// Permissions returns the role's allow lists. Nothing outside them is
// allowed; the Operator may do everything.
func (r Role) Permissions() Permissions {
	switch r {
	case Operator:
		return Permissions{Publish: []string{">"}, Subscribe: []string{">"}}
	case Orchestrator:
		p := r.service(
			// A run request: the intake's, handed over.
			pub(events.FilterRunRequested, events.FilterTurnCompleted, events.FilterRunStarted, events.FilterRunSuspended,
				events.FilterRunResumed, events.FilterRunCompleted, events.FilterRunFailed, events.FilterRunCancelled,
				events.FilterCallCompleted),
			// A tenant producer's cancel, handed over from its intake.
			pub(events.FilterRunCancelRequested),
			consume(events.StreamRuns, events.StreamCalls),
			// The intake of tenant producers, handed over as run requests.
			consume(events.StreamIntake),
			kvRead(provision.BucketTools, events.BucketApprovals),
			kvWrite(provision.BucketRunState),
			objWrite(provision.ObjectBlobs),
			// Runs' deadlines: armed on the timer stream, fired through its
			// durable consumer, deleted once handled.
			[]string{provision.SubjectsTimers, "$JS.API.STREAM.MSG.DELETE." + provision.StreamTimers},
			consume(provision.StreamTimers),
		)
		// Runs' cancel requests, live: a model call of a cancelled run is
		// stopped (services/orchestrator/cancel.go).
		p.Subscribe = append(p.Subscribe, events.Filters(events.FilterRunCancelRequested)...)
		// The deltas of streamed model answers, on core NATS only.
		p.Publish = append(p.Publish, events.SubjectsDelta)
		return p
	case Policy:
		return r.service(
			pub(events.FilterCallApproved, events.FilterCallApprovalRequired, events.FilterCallCompleted),
			[]string{events.SubjectPreview},
			consume(events.StreamRuns, events.StreamCalls),
			kvRead(provision.BucketTools, provision.BucketWorkers),
			kvWrite(events.BucketApprovals),
		)
	case Executor:
		p := r.service(
			pub(events.FilterCallStarted, events.FilterCallCompleted, events.FilterSandboxRequested),
			consume(events.StreamCalls, events.StreamSandbox),
			kvRead(provision.BucketSecrets),
			kvWrite(provision.BucketTools, provision.BucketCache, provision.BucketRate, provision.BucketOutcomes, provision.BucketWorkers),
			objWrite(provision.ObjectBlobs),
		)
		// The consumer of a sandbox job's result, deleted once read; never
		// the sandbox service's own durable consumer.
		p.Publish = append(p.Publish, "$JS.API.CONSUMER.DELETE."+events.StreamSandbox+".>")
		p.PublishDeny = append(p.PublishDeny, "$JS.API.CONSUMER.DELETE."+events.StreamSandbox+"."+SandboxDurable)
		// The guard's preview requests and the workers' requests (about their
		// queues: register, beat, leave); the executor answers each once.
		p.Subscribe = append(p.Subscribe, events.SubjectPreview, events.SubjectsWorkerRPC)
		p.Responses = true
		// The calls it hands workers (pkg/events/worker.go).
		p.Publish = append(p.Publish, events.Prefix+".worker.*.*")
		// Whether a call's run has ended, read from the runs stream's
		// leader before a late call is started (services/executor/runover.go).
		p.Publish = append(p.Publish, "$JS.API.STREAM.MSG.GET."+events.StreamRuns)
		// Runs' cancel requests, live: the calls of a cancelled run are
		// stopped (events/cancel.go).
		p.Subscribe = append(p.Subscribe, events.Filters(events.FilterRunCancelRequested)...)
		return p
	case Sandbox:
		p := r.service(
			pub(events.FilterSandboxCompleted),
			consume(events.StreamSandbox),
			kvWrite(provision.BucketTools),
		)
		// Runs' cancel requests, live: the jobs of a cancelled run are
		// killed.
		p.Subscribe = append(p.Subscribe, events.Filters(events.FilterRunCancelRequested)...)
		return p
	case Recorder:
		p := r.service(
			// Decisions and cancels of the timeline page and the HTTP API,
			// and the requests of runs submitted over HTTP (stored as
			// client.Submit does; the tenant is the credential's).
			pub(events.FilterCallDecided, events.FilterRunCancelRequested, events.FilterRunRequested),
			consume(events.StreamRuns, events.StreamCalls, events.StreamSandbox, events.StreamDLQ),
			// The registry's admin API (an admin of every tenant): it
			// registers through registry.Registry, which refuses a changed
			// version whoever asks.
			kvWrite(provision.BucketTools),
			// Which scopes hold which secret, for the catalog's auth status:
			// the names' bucket, never the sealed values'.
			kvRead(events.BucketApprovals, provision.BucketSecretNames),
			// The catalog's live workers of each queue, from their
			// heartbeats, and where a tenant stands in a tool's rate limit
			// (the executors' token buckets; it never takes a token).
			kvRead(provision.BucketWorkers, provision.BucketRate),
			objRead(provision.ObjectBlobs, provision.ObjectDeadLetters),
		)
		// The events of the runs its API's clients wait on, live: each
		// wakes the recorder's consumer of its stream (services/recorder/
		// live.go), which reads every stream anyway.
		// The model's deltas of those runs, for its live stream.
		p.Subscribe = append(p.Subscribe, events.SubjectsRuns, events.SubjectsCalls, events.SubjectsSandbox, events.SubjectsDelta)
		return p
	case Operations:
		return operations()
	case Producer:
		// In its own account (accounts.go): what it may send into the system
		// account, and the run and call events it receives live.
		var reads []string
		for _, s := range producerReads() {
			reads = append(reads,
				events.ImportedJSAPI+".STREAM.INFO."+s, events.ImportedJSAPI+".STREAM.MSG.GET."+s,
				events.ImportedJSAPI+".DIRECT.GET."+s, events.ImportedJSAPI+".DIRECT.GET."+s+".>")
		}
		return Permissions{
			// $JS.API.INFO is answered in its own account, which has no
			// JetStream: how a client learns it is a producer's
			// (direct.JetStream).
			Publish:   flat(pub(events.FilterRunRequested, events.FilterRunCancelRequested), []string{events.SubjectsIntake, "$JS.API.INFO"}, reads),
			Subscribe: []string{r.InboxPrefix() + ".>", events.SubjectsRuns, events.SubjectsCalls, events.SubjectsDelta},
		}
	}
	return Permissions{}
}

// service is what every service role shares besides its own lists: the
// JetStream account info, provisioning what is missing (creating toolwire's
// streams and buckets; never changing, deleting or purging what exists: a
// lower limit would be a purge by another name), dead letters, flow
// control, and its inbox.
func (r Role) service(lists ...[]string) Permissions {
	pubs := flat(lists...)
	pubs = append(pubs, "$JS.API.INFO", "$JS.FC.>", events.SubjectsDLQ)
	for _, s := range provisioned() {
		pubs = append(pubs, "$JS.API.STREAM.INFO."+s, "$JS.API.STREAM.CREATE."+s)
	}
	pubs = append(pubs, objWrite(provision.ObjectDeadLetters)...)
	return Permissions{Publish: dedupe(pubs), Subscribe: []string{r.InboxPrefix() + ".>"}}
}

// provisioned names every stream toolwire provisions: the event streams and
// those under its buckets.
func provisioned() []string {
	var out []string
	for _, s := range (provision.StoreConfig{}).StreamConfigs() {
		out = append(out, s.Name)
	}
	for _, kv := range (provision.StoreConfig{}).KVConfigs() {
		out = append(out, "KV_"+kv.Bucket)
	}
	for _, o := range (provision.StoreConfig{}).ObjectConfigs() {
		out = append(out, "OBJ_"+o.Bucket)
	}
	return out
}

func pub(fs ...events.Filter) []string { return events.Filters(fs...) }

// read lets a role look into streams: their info, single messages, and
// ordered (ephemeral) consumers.
func read(streams ...string) []string {
	var out []string
	for _, s := range streams {
		out = append(out,
			"$JS.API.STREAM.INFO."+s,
			"$JS.API.STREAM.MSG.GET."+s,
			"$JS.API.DIRECT.GET."+s, "$JS.API.DIRECT.GET."+s+".>",
			"$JS.API.CONSUMER.CREATE."+s, "$JS.API.CONSUMER.CREATE."+s+".>",
			// Not CONSUMER.DELETE: that would let a role delete another's
			// durable consumer; ordered consumers expire when unused.
			"$JS.API.CONSUMER.INFO."+s+".>",
			"$JS.API.CONSUMER.MSG.NEXT."+s+".>",
		)
	}
	return out
}

// consume is read plus durable consumers and their acknowledgements.
func consume(streams ...string) []string {
	out := read(streams...)
	for _, s := range streams {
		out = append(out, "$JS.API.CONSUMER.DURABLE.CREATE."+s+".>", "$JS.ACK."+s+".>")
	}
	return out
}

// bucketRead lets a role get and watch the entries of buckets whose streams
// are prefix+bucket (KV_, OBJ_). A watcher's consumer is deleted when the
// watch stops; a bucket has no durable consumers, so deleting consumers on
// it takes nothing from another role.
func bucketRead(prefix string, buckets ...string) []string {
	var out []string
	for _, b := range buckets {
		out = append(out, read(prefix+b)...)
		out = append(out, "$JS.API.CONSUMER.DELETE."+prefix+b+".>")
	}
	return out
}

// kvRead lets a role get and watch a KV bucket's keys.
func kvRead(buckets ...string) []string { return bucketRead("KV_", buckets...) }

func kvWrite(buckets ...string) []string {
	out := kvRead(buckets...)
	for _, b := range buckets {
		out = append(out, "$KV."+b+".>")
	}
	return out
}

// objRead lets a role get and watch an object store's objects.
func objRead(buckets ...string) []string { return bucketRead("OBJ_", buckets...) }

// objWrite also lets the role purge the bucket's stream: replacing or
// deleting an object purges its old chunks.
func objWrite(buckets ...string) []string {
	out := objRead(buckets...)
	for _, b := range buckets {
		out = append(out, "$O."+b+".>", "$JS.API.STREAM.PURGE.OBJ_"+b)
	}
	return out
}

func flat(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	return dedupe(out)
}

func dedupe(s []string) []string {
	seen := make(map[string]bool, len(s))
	out := s[:0:0]
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}
