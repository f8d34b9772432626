module github.com/toolwire/toolwire/deploy

go 1.26.8

require (
	github.com/moby/patternmatcher v0.6.1
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
	mvdan.cc/sh/v3 v3.14.1
	sigs.k8s.io/yaml v1.6.0
)

require (
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
