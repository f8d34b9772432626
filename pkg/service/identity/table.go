package identity

import (
	"fmt"
	"slices"
	"strings"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
)

// Markdown is the table of the roles in docs/operations.md: the events each
// may publish, the buckets it may write, the streams it consumes and what
// else it may read, summarized from Permissions.
func Markdown() string {
	var b strings.Builder
	b.WriteString("| role | account | what it is | may publish (events) | may write (KV, objects) | consumes (durable) | may read |\n|---|---|---|---|---|---|---|\n")
	for _, r := range Roles() {
		if r == Operator {
			fmt.Fprintf(&b, "| `%s` | `%s` | %s | everything | everything | everything | everything |\n", r, r.Account(), r.Doc())
			continue
		}
		var pubs, writes, consumes, reads []string
		for _, s := range r.Permissions().Publish {
			switch {
			case s == events.SubjectPreview:
				pubs = append(pubs, "requests on `"+s+"`")
			case strings.HasPrefix(s, events.Prefix+".") && s != events.SubjectsDLQ:
				pubs = append(pubs, "`"+s+"`")
			case strings.HasPrefix(s, "$KV."):
				writes = append(writes, "KV `"+strings.TrimSuffix(strings.TrimPrefix(s, "$KV."), ".>")+"`")
			case strings.HasPrefix(s, "$O.") && s != "$O."+provision.ObjectDeadLetters+".>":
				writes = append(writes, "objects `"+strings.TrimSuffix(strings.TrimPrefix(s, "$O."), ".>")+"`")
			case strings.HasPrefix(s, "$JS.ACK."):
				consumes = append(consumes, "`"+strings.TrimSuffix(strings.TrimPrefix(s, "$JS.ACK."), ".>")+"`")
			case strings.HasPrefix(s, "$JS.API.STREAM.MSG.GET."):
				reads = append(reads, "`"+strings.TrimPrefix(s, "$JS.API.STREAM.MSG.GET.")+"`")
			case strings.HasPrefix(s, events.ImportedJSAPI+".STREAM.MSG.GET."):
				reads = append(reads, "`"+strings.TrimPrefix(s, events.ImportedJSAPI+".STREAM.MSG.GET.")+"` (direct gets)")
			}
		}
		// What it consumes or writes, it reads too; dead letters every
		// service writes.
		reads = slices.DeleteFunc(reads, func(s string) bool {
			bucket := strings.TrimPrefix(strings.TrimPrefix(strings.Trim(s, "`"), "KV_"), "OBJ_")
			return slices.Contains(consumes, s) || bucket == provision.ObjectDeadLetters ||
				slices.Contains(writes, "KV `"+bucket+"`") || slices.Contains(writes, "objects `"+bucket+"`")
		})
		if r.Permissions().Responses {
			pubs = append(pubs, "replies to `"+events.SubjectPreview+"`")
		}
		fmt.Fprintf(&b, "| `%s` | `%s` | %s | %s | %s | %s | %s |\n", r, r.Account(), r.Doc(),
			orNone(pubs), orNone(writes), orNone(consumes), orNone(reads))
	}
	return b.String()
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, ", ")
}
