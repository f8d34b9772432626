module github.com/toolwire/toolwire/services/sandbox

go 1.26.8
