// Package e2e holds toolwire's end-to-end tests that run the services as
// separate processes.
package e2e
