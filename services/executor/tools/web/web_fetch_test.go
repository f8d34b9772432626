package web

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
)

const testPage = `<!doctype html>
<html><head><title>  The   Test Page </title>
<style>body { color: red }</style>
<script>alert("no")</script></head>
<body>
<header><a href="/">Home</a> | <a href="/about">About</a></header>
<nav><ul><li>Menu item</li></ul></nav>
<main>
  <h1>Readable heading</h1>
  <p>Some <strong>bold</strong> text and a <a href="/docs/intro">relative link</a>.</p>
  <ul><li>first</li><li>second</li></ul>
  <table><tr><th>name</th><th>price</th></tr><tr><td>tea</td><td>3</td></tr></table>
  <div hidden>hidden text</div>
  <form><input name="q"><button>Search</button></form>
</main>
<footer>Copyright footer</footer>
</body></html>`

func TestWebFetch(t *testing.T) {
	srv := newCounted(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/page":
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = io.WriteString(w, testPage)
		case "/latin1":
			w.Header().Set("Content-Type", "text/html; charset=iso-8859-1")
			_, _ = w.Write([]byte("<html><head><title>caf\xe9</title></head><body><p>cr\xe8me br\xfbl\xe9e</p></body></html>"))
		case "/sniffed":
			_, _ = io.WriteString(w, "<html><body><article><p>article only</p></article><p>outside</p></body></html>")
		case "/text":
			w.Header().Set("Content-Type", "text/plain")
			_, _ = io.WriteString(w, "just text\nlines")
		case "/json":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"a":1}`)
		case "/image":
			w.Header().Set("Content-Type", "image/png")
			_, _ = w.Write([]byte("\x89PNG\r\n\x1a\n"))
		case "/moved":
			http.Redirect(w, r, "/page", http.StatusMovedPermanently)
		case "/gone":
			http.Error(w, "<p>gone</p>", http.StatusNotFound)
		case "/down":
			http.Error(w, "down", http.StatusBadGateway)
		}
	})
	web := newTestClient(t, Config{AllowHosts: []string{srv.hostPort()}})
	tl := webFetchTool{web: web, now: time.Now}

	out, te := runTool(t, tl, input(map[string]any{"url": srv.URL + "/moved"}), nil)
	require.Nil(t, te)
	require.Equal(t, srv.URL+"/page", out["url"], "the final URL after the redirect")
	require.EqualValues(t, 200, out["status"])
	require.Equal(t, "text/html", out["content_type"])
	require.Equal(t, "The Test Page", out["title"])
	content := out["content"].(string)
	require.Contains(t, content, "# Readable heading")
	require.Contains(t, content, "Some **bold** text and a ["+"relative link]("+srv.URL+"/docs/intro).")
	require.Contains(t, content, "- first\n- second")
	require.Contains(t, content, "| name | price |")
	require.Contains(t, content, "| tea  | 3     |")
	for _, gone := range []string{"alert", "color: red", "Menu item", "Copyright footer", "About", "hidden text", "Search"} {
		require.NotContains(t, content, gone)
	}
	require.Equal(t, false, out["truncated"])

	out, te = runTool(t, tl, input(map[string]any{"url": srv.URL + "/latin1"}), nil)
	require.Nil(t, te)
	require.Equal(t, "café", out["title"])
	require.Equal(t, "crème brûlée", out["content"])

	out, te = runTool(t, tl, input(map[string]any{"url": srv.URL + "/sniffed"}), nil)
	require.Nil(t, te)
	require.Equal(t, "text/html", out["content_type"])
	require.Equal(t, "article only", out["content"])

	out, te = runTool(t, tl, input(map[string]any{"url": srv.URL + "/text", "max_chars": 4}), nil)
	require.Nil(t, te)
	require.Equal(t, "just", out["content"])
	require.Equal(t, true, out["truncated"])

	out, te = runTool(t, tl, input(map[string]any{"url": srv.URL + "/json"}), nil)
	require.Nil(t, te)
	require.Equal(t, `{"a":1}`, out["content"])

	out, te = runTool(t, tl, input(map[string]any{"url": srv.URL + "/gone"}), nil)
	require.Nil(t, te)
	require.EqualValues(t, 404, out["status"])

	_, te = runTool(t, tl, input(map[string]any{"url": srv.URL + "/image"}), nil)
	require.Equal(t, envelope.CodeValidation, te.Code)
	require.Contains(t, te.Message, "is image/png, not a page")

	_, te = runTool(t, tl, input(map[string]any{"url": srv.URL + "/down"}), nil)
	require.Equal(t, envelope.CodeProviderError, te.Code)

	// The same guard as http_request.
	_, te = runTool(t, tl, input(map[string]any{"url": "http://0x7f000001/page"}), nil)
	require.NotNil(t, te)
	require.Equal(t, envelope.CodePolicyDenied, te.Code)
	require.Contains(t, te.Message, "destination 0x7f000001 (127.0.0.1) is a loopback address")
}

// TestWebFetchNestingLimit: a page nested deeper than the HTML parser holds
// is a PROVIDER_ERROR that says so and names the limit, whatever nests:
// elements closed or left open, inline and formatting elements, tables,
// lists, quotes, code, SVG and MathML. A page just within the limit converts.
// Depth counts the elements open at once, html and body included.
func TestWebFetchNestingLimit(t *testing.T) {
	kinds := []struct {
		name       string
		open, shut string
		per        int // elements each repetition opens
	}{
		{"div", "<div>", "</div>", 1},
		{"div left open", "<div>x", "", 1},
		{"span", "<span>", "</span>", 1},
		{"bold", "<b>", "", 1},
		{"bold and italic", "<b><i>", "", 2},
		{"blockquote", "<blockquote>", "</blockquote>", 1},
		{"table", "<table><tr><td>", "</td></tr></table>", 4}, // table, tbody, tr, td
		{"table left open", "<table><tr><td>", "", 4},
		{"unordered list", "<ul><li>", "</li></ul>", 2},
		{"ordered list", "<ol><li>", "", 2},
		{"definition list", "<dl><dd>", "", 2},
		{"svg", "<svg><g>", "", 2},
		{"mathml", "<math><mrow>", "", 2},
		{"inline code", "<code>", "", 1},
	}
	page := func(open, shut string, n int) string {
		return "<html><body>" + strings.Repeat(open, n) + "deep" + strings.Repeat(shut, n) + "</body></html>"
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			fits := (htmlMaxDepth - 2) / k.per // html and body
			_, _, err := htmlToMarkdown(t.Context(), page(k.open, k.shut, fits), "http://example.test/")
			require.NoError(t, err, "%d levels fit", fits)
			_, _, err = htmlToMarkdown(t.Context(), page(k.open, k.shut, htmlMaxDepth), "http://example.test/")
			require.ErrorIs(t, err, errNestedTooDeep)
		})
	}
	// The limit is x/net/html's, exactly: html, body and 510 divs parse.
	_, _, err := htmlToMarkdown(t.Context(), page("<div>", "", htmlMaxDepth-2), "http://example.test/")
	require.NoError(t, err)
	_, _, err = htmlToMarkdown(t.Context(), page("<div>", "", htmlMaxDepth-1), "http://example.test/")
	require.ErrorIs(t, err, errNestedTooDeep)

	srv := newCounted(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		k := kinds[0]
		if r.URL.Path == "/tables" {
			k = kinds[6]
		}
		_, _ = io.WriteString(w, page(k.open, k.shut, htmlMaxDepth))
	})
	tl := webFetchTool{web: newTestClient(t, Config{AllowHosts: []string{srv.hostPort()}}), now: time.Now}
	for _, path := range []string{"/divs", "/tables"} {
		_, te := runTool(t, tl, input(map[string]any{"url": srv.URL + path}), nil)
		require.NotNil(t, te, path)
		require.Equal(t, envelope.CodeProviderError, te.Code, te.Message)
		require.Equal(t, fmt.Sprintf("web_fetch: %s%s: the page's HTML is nested deeper than 512 levels, more than it can be converted to text", srv.URL, path), te.Message)
	}
}
