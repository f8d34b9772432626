module github.com/toolwire/toolwire/services/policy

go 1.26.8
