// Package timers arms durable timers (the runs' deadlines) as messages with a
// per-message TTL on the timers' stream (provision.StreamTimers) and fires
// each once, on one replica, when the server's delete marker for it arrives
// (TimerRunner).
package timers
