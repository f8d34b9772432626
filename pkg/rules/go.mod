module github.com/toolwire/toolwire/pkg/rules

go 1.26.8

require (
	github.com/stretchr/testify v1.12.1
	github.com/toolwire/toolwire/pkg/envelope v0.1.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/gowebpki/jcs v1.0.2 // indirect
	github.com/santhosh-tekuri/jsonschema/v6 v6.0.3 // indirect
	github.com/segmentio/asm v1.1.3 // indirect
	github.com/segmentio/encoding v0.5.4 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.5.0 // indirect
	golang.org/x/text v0.14.0 // indirect
)
