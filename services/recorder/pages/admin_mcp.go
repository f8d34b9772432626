package pages

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/executor/tools/mcp"
	"github.com/toolwire/toolwire/services/recorder/auth"
)

// --- the registry page's MCP dialog ---

// mcpForm is the MCP dialog's fields, kept when it is refused.
type mcpForm struct {
	Name, Transport, Command, URL string
	Version                       string
	Category                      envelope.Category
	SideEffects                   string // "": from each tool's annotations
	BareNames                     bool
	TimeoutMS                     string
}

func newMCPForm() mcpForm {
	return mcpForm{Transport: string(mcp.HTTP), Version: mcp.DefaultToolVersion, Category: envelope.CategoryAPI}
}

// mcpRegisterWait bounds connecting to the server, listing its tools and
// writing their entries.
const mcpRegisterWait = 30 * time.Second

// formField names an option as the MCP dialog labels it.
func formField(option string) string {
	switch option {
	case "command":
		return "the command"
	case "url":
		return "the URL"
	case "tool-timeout":
		return "the timeout"
	case "side-effects":
		return "side effects"
	}
	return option
}

// registerMCP is the MCP dialog's POST: the server and options are checked
// as `toolwire tools mcp add` checks its flags, the recorder connects to the
// server, lists its tools and registers each (mcp.RegisterServer), by the
// admin's name.
func (p *pages) registerMCP(w http.ResponseWriter, r *http.Request) {
	reg, ok := p.registry(w, r)
	if !ok {
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		p.pageError(w, r, http.StatusBadRequest, "Bad form: "+err.Error())
		return
	}
	pf := r.PostForm
	f := mcpForm{Name: strings.TrimSpace(pf.Get("name")), Transport: pf.Get("transport"), Command: strings.TrimSpace(pf.Get("command")),
		URL: strings.TrimSpace(pf.Get("url")), Version: strings.TrimSpace(pf.Get("version")), Category: envelope.Category(pf.Get("category")),
		SideEffects: pf.Get("side_effects"), BareNames: pf.Get("bare_names") == "true", TimeoutMS: strings.TrimSpace(pf.Get("timeout_ms"))}
	refuse := func(status int, msg string) {
		p.renderAdminPage(w, r, reg, status, adminPage{MCP: f, MCPProblem: "Not registered: " + msg})
	}
	command, endpoint := "", f.URL
	switch mcp.Transport(f.Transport) {
	case mcp.Stdio:
		command, endpoint = f.Command, ""
		if !p.opts.MCPStdio {
			refuse(http.StatusForbidden, fmt.Sprintf("this recorder does not start programs for a web form (TOOLWIRE_RECORDER_MCP_STDIO=1 allows it, on the recorder's host). "+
				"Register the server from a host that has the program: toolwire tools mcp add %s --command %s", f.Name, strconv.Quote(f.Command)))
			return
		}
	case mcp.HTTP:
	default:
		refuse(http.StatusUnprocessableEntity, fmt.Sprintf("transport %q is not one of stdio, http", f.Transport))
		return
	}
	srv, err := mcp.ParseServer(f.Name, command, endpoint, formField)
	if err != nil {
		refuse(http.StatusUnprocessableEntity, err.Error())
		return
	}
	opts := mcp.RegisterOptions{Version: f.Version, BareNames: f.BareNames, Category: f.Category,
		SideEffects: envelope.SideEffects(f.SideEffects), By: auth.FromContext(r.Context()).Name}
	if f.TimeoutMS != "" {
		ms, err := strconv.Atoi(f.TimeoutMS)
		if err != nil || ms <= 0 {
			refuse(http.StatusUnprocessableEntity, fmt.Sprintf("timeout %q must be a number of milliseconds above 0", f.TimeoutMS))
			return
		}
		opts.TimeoutMS = ms
	}
	if err := opts.Validate(formField); err != nil {
		refuse(http.StatusUnprocessableEntity, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), mcpRegisterWait)
	defer cancel()
	res, err := mcp.RegisterServer(ctx, reg, srv, opts)
	if err != nil {
		p.log.Warn("registry page: MCP server not registered", "server", srv.String(), "err", err)
		refuse(http.StatusBadGateway, fmt.Sprintf("%s: %v", srv, err))
		return
	}
	if len(res.Tools) == 0 {
		refuse(http.StatusUnprocessableEntity, fmt.Sprintf("%s offers no tool that can be registered (%s)", srv, strings.Join(res.Skipped, "; ")))
		return
	}
	p.log.Info("MCP server registered", "server", srv.String(), "tools", len(res.Tools), "skipped", len(res.Skipped), "by", opts.By, "via", "registry page")
	q := url.Values{"mcp": {srv.Name}, "tools": {strconv.Itoa(len(res.Tools))}, "skipped": {strconv.Itoa(len(res.Skipped))}}
	http.Redirect(w, r, "/admin/tools?"+q.Encode(), http.StatusSeeOther)
}
