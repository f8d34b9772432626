module github.com/toolwire/toolwire/pkg/events

go 1.26.8
