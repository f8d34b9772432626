package mcp

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
)

func TestServerValidate(t *testing.T) {
	ok := []Server{
		{Name: "fs", Transport: Stdio, Command: "/usr/bin/mcp-fs", Args: []string{"--root", "/tmp"}},
		{Name: "api-2", Transport: HTTP, URL: "https://mcp.example.com/mcp"},
	}
	for _, s := range ok {
		require.NoError(t, s.Validate(), s)
	}
	bad := map[string]Server{
		`MCP server name "a b"`:                   {Name: "a b", Transport: Stdio, Command: "x"},
		`MCP server name ""`:                      {Transport: Stdio, Command: "x"},
		"a stdio MCP server needs a command":      {Name: "s", Transport: Stdio},
		"a stdio MCP server has no url":           {Name: "s", Transport: Stdio, Command: "x", URL: "http://x"},
		"scheme must be http or https":            {Name: "s", Transport: HTTP, URL: "ftp://x"},
		"no host":                                 {Name: "s", Transport: HTTP, URL: "http:///mcp"},
		"an http MCP server has no command":       {Name: "s", Transport: HTTP, URL: "http://x", Command: "y"},
		`MCP transport "sse" is not one of stdio`: {Name: "s", Transport: "sse", URL: "http://x"},
		"NUL": {Name: "s", Transport: Stdio, Command: "x\x00"},
	}
	for want, s := range bad {
		require.ErrorContains(t, s.Validate(), want)
	}
	_, err := ParseConfig(json.RawMessage(`{"server":"s","transport":"http","url":"http://x"}`))
	require.ErrorContains(t, err, "no tool name")
	_, err = ParseConfig(json.RawMessage(`[1]`))
	require.ErrorContains(t, err, "mcp implementation config")

	require.Equal(t, "srv_add", toolName("srv", "add", false))
	require.Equal(t, "add", toolName("srv", "add", true))
	require.Equal(t, "srv_math_pi", toolName("srv", "math.pi", false))
	long := toolName("srv", string(make([]byte, 80)), false)
	require.Len(t, long, 64)
	require.NoError(t, envelope.ToolRef{Name: long, Version: "1.0.0"}.Validate())
}
