// Package deploy holds the tests of the repository's deploy files, in a
// module of their own so that the Kubernetes and Docker libraries they need
// stay out of every binary's build: the Dockerfile and .dockerignore (every
// image target's binaries build from the context .dockerignore leaves, see
// imagecheck), deploy/k8s (rendered with kustomize and decoded into the
// Kubernetes API types), the NATS Helm values in deploy/nats and the
// docker-compose files.
//
// No binary imports this module; its packages dockerfile, buildctx and
// imagecheck are the tools the tests use.
package deploy
