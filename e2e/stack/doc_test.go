// Package stack_test runs the whole pipeline of package stack in one process,
// the recorder included (recorder.ForStack): approvals, the canary, a
// three-node cluster, the executor, identities, the orchestrator, queues,
// the registry and the sandbox. These tests live in the root module, not in
// the stack's: the stack's module must not require the recorder, or every
// worker's module graph (through workertest) would carry its databases.
package stack_test
