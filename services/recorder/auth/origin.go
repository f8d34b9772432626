package auth

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// ErrCrossOrigin is returned by CheckOrigin.
var ErrCrossOrigin = errors.New("cross-origin request refused")

// CookieAuthenticated reports whether r would authenticate with the session
// cookie: it carries the cookie and no Authorization header (Credential
// prefers the header). Only such a request carries an ambient credential a
// browser adds on its own, and so needs an origin check before it changes
// anything.
func CookieAuthenticated(r *http.Request) bool {
	if r.Header.Get("Authorization") != "" {
		return false
	}
	_, err := r.Cookie(SessionCookie)
	return err == nil
}

// StateChanging reports whether r's method may change state.
func StateChanging(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return false
	}
	return true
}

// OwnOrigin is the origin r was sent to, as a browser writes it:
// scheme://host[:port], the port left out when it is the scheme's default.
// The scheme is https when the recorder terminates TLS or a proxy in front
// says so (X-Forwarded-Proto or Forwarded proto=https, headers a page of
// another origin cannot make a browser send), else http; the host is the
// request's Host.
func OwnOrigin(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil || forwardedHTTPS(r) {
		scheme = "https"
	}
	return normalOrigin(scheme, r.Host)
}

func forwardedHTTPS(r *http.Request) bool {
	if p, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Proto"), ","); strings.EqualFold(strings.TrimSpace(p), "https") {
		return true
	}
	first, _, _ := strings.Cut(r.Header.Get("Forwarded"), ",")
	for part := range strings.SplitSeq(first, ";") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		if strings.EqualFold(k, "proto") && strings.EqualFold(strings.Trim(v, `"`), "https") {
			return true
		}
	}
	return false
}

// normalOrigin writes scheme://host[:port] in lower case, without the
// scheme's default port.
func normalOrigin(scheme, hostport string) string {
	scheme, hostport = strings.ToLower(scheme), strings.ToLower(hostport)
	if host, port, err := net.SplitHostPort(hostport); err == nil &&
		((scheme == "http" && port == "80") || (scheme == "https" && port == "443")) {
		hostport = host
		if strings.Contains(host, ":") {
			hostport = "[" + host + "]"
		}
	}
	return scheme + "://" + hostport
}

// originOf is the origin of an absolute URL (an Origin or Referer header);
// "" when it is not one.
func originOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") || u.User != nil {
		return ""
	}
	return normalOrigin(u.Scheme, u.Host)
}

// CheckOrigin refuses (ErrCrossOrigin) a request a browser sent from
// another origin than the one it is addressed to (OwnOrigin), comparing
// scheme, host and port exactly: a page of another port of the same host,
// or of a sibling subdomain, is same-site for the browser (which then sends
// a SameSite=Lax cookie) but not same-origin. It reads the Origin header;
// without one, Sec-Fetch-Site, which must be same-origin; without either,
// the Referer's origin. A request with none of the three is refused too: a
// browser always sends one of them with a request that changes state, and
// another client has no business sending a session cookie instead of a
// bearer token.
func CheckOrigin(r *http.Request) error {
	own := OwnOrigin(r)
	site := r.Header.Get("Sec-Fetch-Site")
	if site != "" && site != "same-origin" {
		return fmt.Errorf("%w: the browser says it comes from a %s page (Sec-Fetch-Site), not from %s", ErrCrossOrigin, site, own)
	}
	if o := r.Header.Get("Origin"); o != "" {
		if got := originOf(o); got == "" || got != own {
			return fmt.Errorf("%w: Origin %q is not %s", ErrCrossOrigin, o, own)
		}
		return nil
	}
	if site == "same-origin" {
		return nil
	}
	if ref := r.Header.Get("Referer"); ref != "" {
		if got := originOf(ref); got == "" || got != own {
			return fmt.Errorf("%w: Referer %q is not of %s", ErrCrossOrigin, ref, own)
		}
		return nil
	}
	return fmt.Errorf("%w: a request authenticated by the session cookie must say where it comes from (Origin, Sec-Fetch-Site or Referer); other clients send Authorization: Bearer <token>", ErrCrossOrigin)
}
