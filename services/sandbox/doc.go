// Package sandbox is toolwire's sandbox service: it runs the code of code
// tools in real isolation and answers each job with the program's output or a
// SANDBOX_ERROR / TIMEOUT that says which limit was hit.
//
// # Wiring
//
// Every replica pulls from one shared durable JetStream consumer, "sandbox",
// on the TOOLWIRE_SANDBOX stream, filtered to toolwire.sandbox.*.*.requested.
// The executor publishes a job (events.SandboxJob: the source, the input, the
// limits, the timeout) for each call of a registry entry whose implementation
// kind is sandbox, and waits for the result (events.SandboxResult) on
// toolwire.sandbox.<run>.<call>.completed. Result ids are deterministic, so a
// redelivered job yields no second result, and a redelivery whose result is
// stored is acknowledged without running the code again. At Start the service
// registers python_exec@1.0.0, the generic code tool.
//
// # Runtimes
//
// gvisor (runsc, an OCI bundle per job on gVisor's own kernel) is the default
// where it works; bwrap (bubblewrap: every namespace, seccomp, read-only system
// directories) is the other. At start each runtime runs a trial job; a runtime
// that fails it is left out with the reason, which every job asking for it
// gets back. With no runtime working, jobs are refused, unless the loudly
// named insecure development setting (TOOLWIRE_SANDBOX_INSECURE_DEV=1) runs
// them without isolation.
//
// # Limits
//
// Each job runs in a job slot with a host uid of its own (as root), under
// rlimits (address space, processes, CPU time, open files, file size), in a
// size-capped tmpfs work directory, with its stdout capped, under a wall-clock
// timeout, and, where the host allows, in a cgroup of its own (memory, pids,
// CPU; v2, else v1). When the job ends, every process of it is killed (the
// cgroup, the process group, the job uid's processes, runsc's container) and
// checked to be gone.
//
// # Cancellation
//
// Every replica also subscribes to the runs' cancel requests
// (toolwire.run.*.cancel_requested, live, no queue group): the running jobs
// of a cancelled run are killed as a job at its timeout is, every process
// of them, and answered TIMEOUT with details.cancelled
// (events.CancelledCallError); a job of the run that comes later is
// answered so without running (cancel.go). Counted in
// toolwire_sandbox_jobs_cancelled_total{stage} (refused, killed).
//
// # Configuration
//
// New(Deps, Config) reads no environment; Build reads the Config from
// Deps.Getenv (ConfigFromEnv: the TOOLWIRE_SANDBOX_* variables EnvVars
// documents), applies its options and calls New. The binary and `toolwire
// dev` both run Build.
//
// # Where things are
//
//   - the service (a consumer of jobs around the engine): service.go,
//     config.go, metrics.go, python_exec.go;
//   - the engine (runtime choice, job slots, limits, results): engine.go,
//     limits.go, classify.go;
//   - the runtimes and what they share: runtime.go (the interface, the
//     sandbox's layout), gvisor.go, bwrap.go with seccomp.go, insecure.go,
//     and process.go (the supervisor every runtime starts its process
//     under), cgroup.go and uids.go (the job's cgroup and host uid).
//
// It is one package on purpose: the runtimes share the supervisor, the job
// slots and the cgroups through unexported types that a package boundary
// would have to export, no other package runs jobs without the service, and
// the escape suite checks the host through the same internals.
package sandbox
