// Package kvwatch keeps a view of a KV bucket current: WatchKV applies every
// entry, the initial ones first, until it is stopped.
package kvwatch
