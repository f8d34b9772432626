package web

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/JohannesKaufmann/html-to-markdown/v2/converter"
	"github.com/JohannesKaufmann/html-to-markdown/v2/plugin/base"
	"github.com/JohannesKaufmann/html-to-markdown/v2/plugin/commonmark"
	"github.com/JohannesKaufmann/html-to-markdown/v2/plugin/table"
	"golang.org/x/net/html"
	"golang.org/x/net/html/atom"
	"golang.org/x/net/html/charset"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// web_fetch fetches a page as readable text: HTML becomes Markdown (by
// github.com/JohannesKaufmann/html-to-markdown: headings, lists, links made
// absolute, tables), without scripts, styles, navigation, headers, footers
// and forms, and only the page's <main> or single <article> when it has one.
// Plain text, Markdown, JSON and XML come back as they are. It uses the same
// SSRF-guarded client as http_request.

const (
	defaultFetchMaxChars = 100_000
	maxFetchMaxChars     = 1_000_000
)

type webFetchTool struct {
	web *Client
	now func() time.Time
}

type webFetchIn struct {
	URL      string `json:"url"`
	MaxChars int    `json:"max_chars"`
}

type webFetchOut struct {
	URL         string `json:"url"`
	Status      int    `json:"status"`
	ContentType string `json:"content_type"`
	Title       string `json:"title"`
	Content     string `json:"content"`
	Truncated   bool   `json:"truncated"`
}

func (t webFetchTool) Definition() envelope.ToolDefinition {
	d := toolapi.BuiltinDefinition("web_fetch",
		"Fetches a web page and returns its readable content as Markdown (or the text of a text, JSON or XML document), with its title. "+
			"Private, loopback and metadata addresses are refused.",
		envelope.CategorySearch,
		`{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "url": {"type": "string", "minLength": 1, "maxLength": 8192, "description": "An http or https URL."},
    "max_chars": {"type": "integer", "minimum": 1, "maximum": 1000000, "default": 100000,
      "description": "The most characters of content to return."}
  },
  "required": ["url"],
  "additionalProperties": false
}`,
		`{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "url": {"type": "string", "description": "The URL of the final response, after redirects."},
    "status": {"type": "integer"},
    "content_type": {"type": "string"},
    "title": {"type": "string"},
    "content": {"type": "string", "description": "Markdown for HTML pages, the text otherwise."},
    "truncated": {"type": "boolean"}
  },
  "required": ["url", "status", "content_type", "title", "content", "truncated"],
  "additionalProperties": false
}`)
	d.Metadata.SideEffects = envelope.SideEffectsReads
	return d
}

func (t webFetchTool) Execute(ctx context.Context, input json.RawMessage, _ toolapi.Context) (json.RawMessage, error) {
	const name = "web_fetch"
	var in webFetchIn
	if err := toolapi.DecodeInput(name, input, &in); err != nil {
		return nil, err
	}
	if in.MaxChars == 0 {
		in.MaxChars = defaultFetchMaxChars
	}
	if in.MaxChars < 0 || in.MaxChars > maxFetchMaxChars {
		return nil, envelope.NewToolError(envelope.CodeValidation, "%s: max_chars must be from 1 to %d", name, maxFetchMaxChars)
	}
	u, err := CheckURL(in.URL)
	if err != nil {
		return nil, envelope.NewToolError(envelope.CodeValidation, "%s: %v", name, err)
	}
	ctx, cancel := t.web.requestContext(ctx, name)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, envelope.NewToolError(envelope.CodeValidation, "%s: %v", name, err)
	}
	req.Header.Set("Accept", "text/html,application/xhtml+xml,text/plain;q=0.9,text/markdown;q=0.9,application/json;q=0.8,*/*;q=0.1")
	req.Header.Set("User-Agent", UserAgent)
	resp, raw, truncated, err := t.web.Do(Request{Tool: name, HTTP: req})
	if err != nil {
		return nil, err
	}
	if te := StatusError(name, resp, raw, nil, t.now(), FailuresOnly); te != nil {
		return nil, te
	}
	ct := resp.Header.Get("Content-Type")
	if ct == "" {
		ct = http.DetectContentType(raw)
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil {
		mt = strings.ToLower(strings.TrimSpace(strings.Split(ct, ";")[0]))
	}
	out := webFetchOut{URL: resp.Request.URL.String(), Status: resp.StatusCode, ContentType: mt, Truncated: truncated}
	text, err := decodeCharset(raw, ct)
	if err != nil {
		return nil, envelope.NewToolError(envelope.CodeProviderError, "%s: %s: the body is not readable text in charset %q", name, u.Redacted(), params["charset"])
	}
	switch {
	case mt == "text/html" || mt == "application/xhtml+xml":
		out.Title, out.Content, err = htmlToMarkdown(ctx, text, resp.Request.URL.String())
		if errors.Is(err, errNestedTooDeep) {
			// The page is what the site served: not the caller's input to
			// fix (VALIDATION_ERROR), not a fault of ours (UNKNOWN) nor of
			// the network; like a body in an unreadable charset, an answer
			// of the provider this tool cannot use.
			return nil, envelope.NewToolError(envelope.CodeProviderError,
				"%s: %s: the page's HTML is nested deeper than %d levels, more than it can be converted to text", name, u.Redacted(), htmlMaxDepth)
		}
		if err != nil && ctx.Err() != nil {
			// The request's time ran out while converting: its cause says
			// which limit (requestContext), as for a failed read.
			return nil, context.Cause(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("web_fetch: convert %s: %w", u.Redacted(), err)
		}
	case strings.HasPrefix(mt, "text/") || isJSONType(ct) || mt == "application/xml" || strings.HasSuffix(mt, "+xml"):
		out.Content = text
	default:
		return nil, envelope.NewToolError(envelope.CodeValidation,
			"%s: %s is %s, not a page; use http_get for other content", name, u.Redacted(), mt)
	}
	if utf8.RuneCountInString(out.Content) > in.MaxChars {
		out.Content = string([]rune(out.Content)[:in.MaxChars])
		out.Truncated = true
	}
	return json.Marshal(out)
}

// decodeCharset returns the body as UTF-8 text, decoding the charset the
// content type or the document declares.
func decodeCharset(raw []byte, contentType string) (string, error) {
	r, err := charset.NewReader(bytes.NewReader(raw), contentType)
	if err != nil {
		return "", err
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return "", err
	}
	return strings.ToValidUTF8(string(b), "\uFFFD"), nil
}

// dropped are elements that are not a page's readable content.
var dropped = map[atom.Atom]bool{
	atom.Script: true, atom.Style: true, atom.Noscript: true, atom.Template: true, atom.Nav: true,
	atom.Header: true, atom.Footer: true, atom.Aside: true, atom.Form: true, atom.Iframe: true,
	atom.Svg: true, atom.Canvas: true, atom.Button: true, atom.Select: true, atom.Object: true,
	atom.Embed: true, atom.Dialog: true,
}

// htmlMaxDepth is the most elements the HTML parser (golang.org/x/net/html)
// holds open at once, html and body included: beyond it, it gives up on the
// page. Every way a page nests (elements left open or closed, tables, lists,
// formatting, SVG and MathML) counts against the same stack, so this is the
// one depth limit of the conversion; TestWebFetchNestingLimit pins it.
const htmlMaxDepth = 512

// errNestedTooDeep is htmlToMarkdown's error for a page nested deeper than
// htmlMaxDepth.
var errNestedTooDeep = errors.New("the page's HTML is nested too deep")

// htmlToMarkdown returns a page's title and its readable content as
// Markdown, with links made absolute against pageURL.
func htmlToMarkdown(ctx context.Context, page, pageURL string) (string, string, error) {
	doc, err := html.Parse(strings.NewReader(page))
	if err != nil {
		// Reading a string, the parser fails only when it gives up: on its
		// open element stack overflowing, or on a panic of its own. The
		// former has no error value to test; its message is pinned by
		// TestWebFetchNestingLimit.
		if strings.Contains(err.Error(), "open stack of elements exceeds") {
			return "", "", fmt.Errorf("%w: %w", errNestedTooDeep, err)
		}
		return "", "", fmt.Errorf("parse the page: %w", err)
	}
	var title string
	var mains, articles []*html.Node
	var remove []*html.Node
	var walk func(n *html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode {
			switch {
			case n.DataAtom == atom.Title && title == "":
				title = strings.Join(strings.Fields(textOf(n)), " ")
			case n.DataAtom == atom.Main:
				mains = append(mains, n)
			case n.DataAtom == atom.Article:
				articles = append(articles, n)
			}
			if dropped[n.DataAtom] || hiddenElement(n) {
				remove = append(remove, n)
				return
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(doc)
	for _, n := range remove {
		if n.Parent != nil {
			n.Parent.RemoveChild(n)
		}
	}
	root := doc
	switch {
	case len(mains) == 1 && mains[0].Parent != nil:
		root = mains[0]
	case len(articles) == 1 && articles[0].Parent != nil:
		root = articles[0]
	}
	conv := converter.NewConverter(converter.WithPlugins(
		base.NewBasePlugin(),
		commonmark.NewCommonmarkPlugin(),
		table.NewTablePlugin(),
	))
	md, err := conv.ConvertNode(root, converter.WithContext(ctx), converter.WithDomain(pageURL))
	if err != nil {
		return title, "", err
	}
	return title, strings.TrimSpace(string(md)), nil
}

// hiddenElement reports elements marked hidden.
func hiddenElement(n *html.Node) bool {
	for _, a := range n.Attr {
		switch strings.ToLower(a.Key) {
		case "hidden":
			return true
		case "aria-hidden":
			if strings.EqualFold(a.Val, "true") {
				return true
			}
		}
	}
	return false
}

// textOf concatenates the text under n.
func textOf(n *html.Node) string {
	var b strings.Builder
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(n)
	return b.String()
}
