package main

import "runtime/debug"

// The garbage collector of the commands that run the whole pipeline in this
// one process (dev, bench): nats-server, five services and their clients
// allocate for every event, and at Go's default (GOGC=100) the collector
// took about a tenth of the CPU of a loaded pipeline. At 400 it runs a
// quarter as often: in one process, alternating 3-second windows of the
// 16-call throughput test, the CPU per tool call fell by about 11% (median
// of six windows each). A soft memory limit keeps the heap from growing
// without bound: near it the collector runs as often as it needs to.
const (
	oneProcessGCPercent   = 400
	oneProcessMemoryLimit = 1 << 30 // bytes
)

// setOneProcessGC sets the collector for a one-process pipeline unless the
// environment chose already: with GOGC or GOMEMLIMIT set the runtime stays as
// the user asked. It reports whether it changed anything.
func setOneProcessGC(getenv func(string) string) bool {
	if getenv("GOGC") != "" || getenv("GOMEMLIMIT") != "" {
		return false
	}
	debug.SetGCPercent(oneProcessGCPercent)
	debug.SetMemoryLimit(oneProcessMemoryLimit)
	return true
}
