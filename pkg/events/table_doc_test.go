package events_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
)

// envUpdateDocs regenerates the docs' generated tables instead of checking
// them: TOOLWIRE_UPDATE_DOCS=1 go test ./pkg/events -run TestEventTableIsCurrent
// (make docs).
const envUpdateDocs = "TOOLWIRE_UPDATE_DOCS"

// eventTable renders the event table, one row per events.Table() row, in
// its order: what docs/architecture.md shows between its markers.
func eventTable() string {
	var b strings.Builder
	b.WriteString("| type | subject | stream | data and its schema | status it sets | what it announces |\n|---|---|---|---|---|---|\n")
	for _, row := range events.Table() {
		dir := "../pkg/envelope/schemas/"
		if _, err := fs.Stat(events.SchemaFS(), row.Schema+".schema.json"); err == nil {
			dir = "../pkg/events/schemas/"
		}
		status := "—"
		switch {
		case row.RunStatus != "" && row.CallStatus != "":
			status = "run `" + row.RunStatus + "`, call `" + row.CallStatus + "`"
		case row.RunStatus != "":
			status = "run `" + row.RunStatus + "`"
		case row.CallStatus != "":
			status = "call `" + row.CallStatus + "`"
		}
		fmt.Fprintf(&b, "| `%s` | `%s` | `%s` | `%s` ([%s](%s%s.schema.json)) | %s | %s |\n",
			row.Type, row.Filter, row.Stream, reflect.TypeOf(row.New()).Elem(), row.Schema, dir, row.Schema,
			status, strings.ReplaceAll(row.Doc, "|", "\\|"))
	}
	return b.String()
}

// TestEventTableIsCurrent: the event table of docs/architecture.md is
// generated from the code's table (events.Table), as the roles, metrics and
// environment tables of docs/operations.md are from theirs, so that it
// cannot drift from it.
func TestEventTableIsCurrent(t *testing.T) {
	root := filepath.Join("..", "..")
	if _, err := os.Stat(filepath.Join(root, "go.work")); err != nil {
		t.Skip("not in a toolwire checkout (the module alone, as a dependency): no docs to check")
	}
	path := filepath.Join(root, "docs", "architecture.md")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	doc := string(b)
	const begin, end = "<!-- generated:events -->\n", "<!-- end:events -->"
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	require.True(t, i >= 0 && j > i, "docs/architecture.md has no %q ... %q section", strings.TrimSpace(begin), end)
	body := eventTable()
	if os.Getenv(envUpdateDocs) == "1" {
		require.NoError(t, os.WriteFile(path, []byte(doc[:i+len(begin)]+body+doc[j:]), 0o644)) //nolint:gosec // the repository's docs
		return
	}
	require.Equal(t, body, doc[i+len(begin):j],
		"docs/architecture.md's event table is out of date: run `make docs` (%s=1 go test ./pkg/events -run TestEventTableIsCurrent)", envUpdateDocs)
}
