package identity

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// Worker is the identity of a worker process (package worker): the queues
// it serves. It lives in an account of its own that reaches nothing but
// the executors' worker requests for its queues (register its tools there,
// announce itself), and answers the calls the executors hand it on those
// queues (pkg/events/worker.go). It has no JetStream access at all: it
// cannot pull another queue's calls, publish an event, write the registry,
// read a blob or a sealed secret. Replicas of one worker share its
// identity; a queue belongs to one worker identity.
type Worker struct {
	Queues []string // sorted, each once
}

// ErrWorker is wrapped when a worker identity cannot be made.
var ErrWorker = errors.New("unusable worker identity")

// WorkerInboxPrefix is the prefix of a worker's reply subjects.
const WorkerInboxPrefix = "_INBOX_worker"

// ParseWorker reads "queue" or "queue1+queue2".
func ParseWorker(s string) (Worker, error) {
	var w Worker
	for q := range strings.SplitSeq(strings.TrimSpace(s), "+") {
		if err := envelope.ValidateQueue(q); err != nil {
			return Worker{}, fmt.Errorf("%w %q: %w", ErrWorker, s, err)
		}
		if q == envelope.DefaultQueue {
			return Worker{}, fmt.Errorf("%w %q: queue %s is the executor's own", ErrWorker, s, q)
		}
		if slices.Contains(w.Queues, q) {
			return Worker{}, fmt.Errorf("%w %q: queue %s twice", ErrWorker, s, q)
		}
		w.Queues = append(w.Queues, q)
	}
	slices.Sort(w.Queues)
	return w, nil
}

// String is "queue" or "queue1+queue2", as ParseWorker reads it.
func (w Worker) String() string { return strings.Join(w.Queues, "+") }

// WorkerAccount names the account of a worker identity: "worker:billing".
func WorkerAccount(w Worker) string { return "worker:" + w.String() }

const workerPrefix = "worker."

// WorkerSeedFile is where Keys keeps a worker's nkey seed in a folder:
// <dir>/worker.<queue>[+<queue>...].nk.
func WorkerSeedFile(dir string, w Worker) string {
	return filepath.Join(dir, workerPrefix+w.String()+".nk")
}

// Permissions are what the worker may do in its account: ask the
// executors about its queues, answer its queues' calls and receive their
// cancels (toolwire.worker.<queue>.*: events.WorkerCancelSubject is one of
// them), receive its replies.
func (w Worker) Permissions() Permissions {
	// Two answers to each call (accepted, then the result), within the
	// longest timeout a worker's tool may have.
	p := Permissions{Publish: []string{"$JS.API.INFO"}, Subscribe: []string{WorkerInboxPrefix + ".>"},
		Responses: true, MaxResponses: 2, ResponsesFor: events.MaxWorkerTimeout}
	for _, q := range w.Queues {
		rpc, _ := events.WorkerRPCSubject(q, ">")
		calls, _ := events.WorkerSubjects(q)
		p.Publish = append(p.Publish, rpc)
		p.Subscribe = append(p.Subscribe, calls)
	}
	return p
}

// imports are what the worker's account takes from the system account: the
// executors' answers to its queues' requests.
func (w Worker) imports() []Import {
	var out []Import
	for _, q := range w.Queues {
		rpc, _ := events.WorkerRPCSubject(q, ">")
		out = append(out, Import{Subject: rpc})
	}
	return out
}

// exports are what the worker's account offers the system account: its
// queues' calls, which the executors request, and their cancels, which the
// executors publish (no reply): the server delivers a queue's cancel into
// that queue's worker account only.
func (w Worker) exports() []string {
	var out []string
	for _, q := range w.Queues {
		calls, _ := events.WorkerSubjects(q)
		out = append(out, calls)
	}
	return out
}

// WorkerConnectOptions sign a connection in as the worker whose seed is in
// seedFile, its replies under WorkerInboxPrefix.
func WorkerConnectOptions(seedFile string) ([]nats.Option, error) {
	return signIn(seedFile, WorkerInboxPrefix)
}

// loadWorkers reads the workers' seeds in k.Dir.
func (k *Keys) loadWorkers() error {
	entries, err := os.ReadDir(k.Dir)
	if err != nil {
		return fmt.Errorf("identities: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, workerPrefix) || !strings.HasSuffix(name, ".nk") {
			continue
		}
		w, err := ParseWorker(strings.TrimSuffix(strings.TrimPrefix(name, workerPrefix), ".nk"))
		if err != nil {
			return fmt.Errorf("identities: seed file %s: %w", name, err)
		}
		if err := k.overlaps(w); err != nil {
			return fmt.Errorf("identities: seed file %s: %w", name, err)
		}
		pub, err := PublicKey(filepath.Join(k.Dir, name))
		if err != nil {
			return err
		}
		k.workers[w.String()] = workerKey{w: w, public: pub}
	}
	return nil
}

type workerKey struct {
	w      Worker
	public string
}

// overlaps refuses a worker identity that shares a queue with another.
func (k *Keys) overlaps(w Worker) error {
	for _, o := range k.workers {
		if o.w.String() == w.String() {
			continue
		}
		for _, q := range w.Queues {
			if slices.Contains(o.w.Queues, q) {
				return fmt.Errorf("%w: queue %s is worker %s's already: a queue belongs to one worker identity (its replicas share the seed)", ErrWorker, q, o.w)
			}
		}
	}
	return nil
}

// AddWorker makes the seed of a worker serving w's queues, unless it has
// one.
func (k *Keys) AddWorker(w Worker) error {
	if len(w.Queues) == 0 {
		return fmt.Errorf("%w: no queue", ErrWorker)
	}
	if err := k.overlaps(w); err != nil {
		return err
	}
	path := WorkerSeedFile(k.Dir, w)
	pub, err := PublicKey(path)
	if errors.Is(err, fs.ErrNotExist) {
		pub, err = create(path)
	}
	if err != nil {
		return err
	}
	k.workers[w.String()] = workerKey{w: w, public: pub}
	return nil
}

// Workers are the worker identities with a seed in the folder, in order.
func (k *Keys) Workers() []Worker {
	out := make([]Worker, 0, len(k.workers))
	for _, wk := range k.workers {
		out = append(out, wk.w)
	}
	slices.SortFunc(out, func(a, b Worker) int { return strings.Compare(a.String(), b.String()) })
	return out
}

// WorkerPublic is the worker's public key ("" when it has none).
func (k *Keys) WorkerPublic(w Worker) string { return k.workers[w.String()].public }

// WorkerSeedFile is where the worker's seed is.
func (k *Keys) WorkerSeedFile(w Worker) string { return WorkerSeedFile(k.Dir, w) }
