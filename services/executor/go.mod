module github.com/toolwire/toolwire/services/executor

go 1.26.8
