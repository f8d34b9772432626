// Package provision creates and updates what toolwire keeps in JetStream: its
// streams, KV buckets and object stores (StoreConfig, Provision), never
// lowering a stream's replicas or limits behind an operator's back
// (LoweringError), and the services' durable consumers (EnsureConsumer). It
// names the buckets (Bucket*) and checks the server's version.
package provision
