module github.com/toolwire/toolwire/services/recorder

go 1.26.8
