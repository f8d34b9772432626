package identity

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
)

// The accounts. NATS permissions check the subject a client publishes on,
// never the reply subject it names, and JetStream sends its answers (a
// PubAck, a direct get's message) from inside the server to whatever reply
// subject a request names: in one account, a client that may publish
// anything JetStream answers could have that answer stored in any stream or
// bucket. So the streams and buckets, toolwire's services and its
// operators are in the system account, and each identity toolwire does not
// run itself (an upstream producer, a tenant producer) is in an account of
// its own, which imports from the system account only the subjects it may
// publish and the reads it may make. Its requests cross into the system
// account with a reply subject the server makes up there, and the answer
// comes back into its own account, where no stream is: whatever reply
// subject it names, nothing is stored. It cannot create a consumer either
// (a push consumer delivers wherever its config says, inside the system
// account), so a producer reads streams by direct gets (client.Follow).
const (
	// SystemAccount holds the streams and buckets, the services' users and
	// the operator's.
	SystemAccount = "TOOLWIRE"
	// ProducerAccount holds the producer trusted with every tenant.
	ProducerAccount = "PRODUCER"
)

// TenantAccount names the account of a tenant producer: "tenant:acme",
// "tenant:acme/eu". No org or workspace id holds ':' or '/', so no two
// tenants share an account.
func TenantAccount(t Tenant) string { return "tenant:" + t.String() }

// Account is the account the role's users are in.
func (r Role) Account() string {
	if r == Producer {
		return ProducerAccount
	}
	return SystemAccount
}

// Import is a subject an account takes from the system account.
type Import struct {
	// Subject is the subject in the system account.
	Subject string
	// To is the subject the importing account's clients use ("": Subject).
	To string
	// Events: the system account's messages on Subject are delivered into
	// the importing account (a stream import: live events, nothing to
	// answer); otherwise the import is a service the importing account's
	// clients send requests to.
	Events bool
	// Batch: the service answers one request with several messages (a batch
	// direct get).
	Batch bool
}

// Account is a NATS account: its users, what it imports from the system
// account, and the services it offers the system account (a worker's
// queues' calls, which the executors request).
type Account struct {
	Name      string
	Doc       string
	JetStream bool
	Users     []User
	Imports   []Import
	Exports   []string
}

// producerReads are the streams a producer reads, by direct gets.
func producerReads() []string {
	return []string{events.StreamRuns, events.StreamCalls, "OBJ_" + provision.ObjectBlobs}
}

// producerImports is what the producer's account takes from the system
// account: its run requests, every tenant's intake, the run and call events
// and the model's deltas live, and direct gets of the streams it follows and the blobs it reads,
// through the JetStream API prefix events.ImportedJSAPI.
func producerImports() []Import {
	out := []Import{
		{Subject: events.Filters(events.FilterRunRequested)[0]},
		{Subject: events.Filters(events.FilterRunCancelRequested)[0]},
		{Subject: events.SubjectsIntake},
		{Subject: events.SubjectsRuns, Events: true},
		{Subject: events.SubjectsCalls, Events: true},
		// The live deltas of streamed model answers (events/delta.go).
		{Subject: events.SubjectsDelta, Events: true},
	}
	api := func(s string) string { return events.ImportedJSAPI + strings.TrimPrefix(s, "$JS.API") }
	for _, s := range producerReads() {
		for _, sub := range []string{"$JS.API.STREAM.INFO." + s, "$JS.API.STREAM.MSG.GET." + s} {
			out = append(out, Import{Subject: sub, To: api(sub)})
		}
		for _, sub := range []string{"$JS.API.DIRECT.GET." + s, "$JS.API.DIRECT.GET." + s + ".>"} {
			out = append(out, Import{Subject: sub, To: api(sub), Batch: true})
		}
	}
	return out
}

// tenantImports is what a tenant producer's account takes: its intake.
func tenantImports(t Tenant) ([]Import, error) {
	filter, err := events.IntakeFilter(t.Org, t.Workspace)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTenant, err)
	}
	return []Import{{Subject: filter}}, nil
}

// Accounts are the system account with the services' and the operator's
// users, the producer's account, and one account per tenant producer.
func (k *Keys) Accounts() []Account {
	sys := Account{Name: SystemAccount, JetStream: true,
		Doc: "the system account: toolwire's streams and buckets, its services and its operators"}
	prod := Account{Name: ProducerAccount, Imports: producerImports(),
		Doc: "the upstream producer trusted with every tenant: its run requests, intakes and reads cross into " + SystemAccount + "; JetStream's answers come back here, where no stream is"}
	for _, u := range k.users() {
		user := User{Doc: u.doc, PublicKey: u.public, Permissions: u.perms}
		switch {
		case u.role.Account() == ProducerAccount:
			prod.Users = append(prod.Users, user)
		case u.role != "":
			sys.Users = append(sys.Users, user)
		}
	}
	out := []Account{sys, prod}
	for _, w := range k.Workers() {
		out = append(out, Account{
			Name: WorkerAccount(w), Imports: w.imports(), Exports: w.exports(),
			Doc: "worker " + w.String() + ": answers the calls of its queues the executors hand it, registers its tools and announces itself there; no JetStream",
			Users: []User{{Doc: "worker " + w.String() + ": serves queues " + strings.Join(w.Queues, ", "),
				PublicKey: k.WorkerPublic(w), Permissions: w.Permissions()}},
		})
	}
	for _, t := range k.Tenants() {
		imports, err := tenantImports(t)
		if err != nil {
			continue // validated when loaded or added
		}
		p, err := t.Permissions(k.tenants[t])
		if err != nil {
			continue
		}
		out = append(out, Account{
			Name: TenantAccount(t), Imports: imports,
			Doc:   "tenant " + t.String() + ": its intake crosses into " + SystemAccount + ", nothing else",
			Users: []User{{Doc: "tenant " + t.String() + ": " + t.Doc(), PublicKey: k.tenants[t], Permissions: p}},
		})
	}
	return out
}

// export is one subject the system account offers other accounts.
type export struct {
	subject  string
	events   bool
	batch    bool
	accounts []string
}

// exports are what the system account must offer for the imports of accs.
func exports(accs []Account) []export {
	var out []export
	for _, a := range accs {
		for _, im := range a.Imports {
			i := slices.IndexFunc(out, func(e export) bool { return e.subject == im.Subject && e.events == im.Events })
			if i < 0 {
				out = append(out, export{subject: im.Subject, events: im.Events, batch: im.Batch})
				i = len(out) - 1
			}
			out[i].accounts = append(out[i].accounts, a.Name)
		}
	}
	return out
}

// ServerConfig is the accounts block of a nats-server configuration file
// that lets in exactly these users, each in its account with its role's
// permissions: what `toolwire identities` prints for a production server,
// and what the embedded server of `toolwire dev` runs with.
func (k *Keys) ServerConfig() string {
	accs := k.Accounts()
	var b strings.Builder
	b.WriteString("# toolwire's NATS accounts and users (toolwire identities). Each binary connects with its role's\n")
	b.WriteString("# seed (TOOLWIRE_NATS_NKEY_SEED_FILE); a producer limited to one tenant with its\n")
	b.WriteString("# tenant.<org>[.<workspace>].nk (toolwire identities --tenant). The server's jetstream block\n")
	b.WriteString("# (store_dir, limits) is yours; only " + SystemAccount + " uses JetStream.\n")
	b.WriteString("accounts {\n")
	for _, a := range accs {
		fmt.Fprintf(&b, "  # %s\n  %q: {\n", a.Doc, a.Name)
		if a.JetStream {
			b.WriteString("    jetstream: enabled\n")
		}
		b.WriteString("    users: [\n")
		for _, u := range a.Users {
			writeUser(&b, u)
		}
		b.WriteString("    ]\n")
		if a.Name == SystemAccount {
			b.WriteString("    exports: [\n")
			for _, e := range exports(accs) {
				kind := "service"
				if e.events {
					kind = "stream"
				}
				fmt.Fprintf(&b, "      { %s: %q, accounts: %s", kind, e.subject, quoted(e.accounts, "        "))
				if e.batch {
					b.WriteString(", response_type: \"stream\"")
				}
				b.WriteString(" }\n")
			}
			b.WriteString("    ]\n")
			var from []string
			for _, o := range accs {
				for _, e := range o.Exports {
					from = append(from, fmt.Sprintf("      { service: { account: %q, subject: %q } }\n", o.Name, e))
				}
			}
			if len(from) > 0 {
				b.WriteString("    imports: [\n" + strings.Join(from, "") + "    ]\n")
			}
		}
		if len(a.Exports) > 0 {
			b.WriteString("    exports: [\n")
			for _, e := range a.Exports {
				// An accepted, then the result, within a worker tool's
				// timeout (pkg/events/worker.go).
				fmt.Fprintf(&b, "      { service: %q, accounts: [%q], response_type: \"stream\", response_threshold: %q }\n",
					e, SystemAccount, events.MaxWorkerTimeout.String())
			}
			b.WriteString("    ]\n")
		}
		if len(a.Imports) > 0 {
			b.WriteString("    imports: [\n")
			for _, im := range a.Imports {
				kind := "service"
				if im.Events {
					kind = "stream"
				}
				fmt.Fprintf(&b, "      { %s: { account: %q, subject: %q }", kind, SystemAccount, im.Subject)
				if im.To != "" {
					fmt.Fprintf(&b, ", to: %q", im.To)
				}
				b.WriteString(" }\n")
			}
			b.WriteString("    ]\n")
		}
		b.WriteString("  }\n")
	}
	b.WriteString("}\n")
	return b.String()
}

func writeUser(b *strings.Builder, u User) {
	p := u.Permissions
	fmt.Fprintf(b, "      # %s\n", u.Doc)
	fmt.Fprintf(b, "      {\n        nkey: %q\n        permissions: {\n", u.PublicKey)
	if len(p.PublishDeny) > 0 {
		fmt.Fprintf(b, "          publish: { allow: %s, deny: %s }\n", quoted(p.Publish, "            "), quoted(p.PublishDeny, "            "))
	} else {
		fmt.Fprintf(b, "          publish: { allow: %s }\n", quoted(p.Publish, "            "))
	}
	fmt.Fprintf(b, "          subscribe: { allow: %s }\n", quoted(p.Subscribe, "            "))
	if p.Responses {
		fmt.Fprintf(b, "          allow_responses: { max: %d, expires: %q }\n", max(p.MaxResponses, 1), cmp.Or(p.ResponsesFor, time.Minute).String())
	}
	b.WriteString("        }\n      }\n")
}
