module github.com/toolwire/toolwire/services/orchestrator

go 1.26.8
