package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/auth"
)

// The write routes (submit.go, cancel.go, decide.go) live on the recorder's
// HTTP server because it is already the front door: it authenticates
// (API tokens, OIDC, the admin token, the pages' session), binds every
// principal to a tenant and a role, checks the origin of cookie-authenticated
// writes, and reads the store a write must consult (is the run this
// tenant's? has it ended?). A write publishes exactly the event the CLI and
// the Go client publish, with the recorder's NATS identity, which may publish
// on the intake, the cancel and the decided subjects and nothing else of the
// kind (pkg/service/identity/roles.go): nats-server, not this code, bounds
// what a bug here could send.

// maxBodyBytes bounds the body of a write.
const maxBodyBytes = 1 << 20

// source is the CloudEvents source of what the API publishes.
const source = "/toolwire/recorder"

// apiError is an error answer of a write: its status, code, message and,
// for an invalid_request, the problems.
type apiError struct {
	status  int
	code    string
	msg     string
	details []string
}

func (e *apiError) write(w http.ResponseWriter) {
	if e.status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	b, _ := json.Marshal(apitypes.ErrorJSON{Error: apitypes.ErrorBody{Code: e.code, Message: e.msg, Details: e.details}})
	writeRaw(w, e.status, b)
}

func invalid(msg string, details ...string) *apiError {
	if len(details) == 0 {
		details = []string{msg}
	}
	return &apiError{status: http.StatusUnprocessableEntity, code: apitypes.CodeInvalidRequest, msg: msg, details: details}
}

func forbidden(msg string) *apiError {
	return &apiError{status: http.StatusForbidden, code: apitypes.CodeForbidden, msg: msg}
}

func unavailable(msg string) *apiError {
	return &apiError{status: http.StatusServiceUnavailable, code: apitypes.CodeUnavailable, msg: msg}
}

// may refuses (403) a principal whose role is below role.
func may(p auth.Principal, role auth.Role, what string) *apiError {
	if p.Can(role) {
		return nil
	}
	who := string(p.Role)
	if who == "" {
		who = "caller without a role"
	}
	return forbidden(fmt.Sprintf("you are a %s: %s needs the role %s or above (viewer < producer < approver < admin)", who, what, role))
}

// readBody reads a write's JSON body: at most maxBodyBytes (413 beyond),
// with Content-Type application/json (415 otherwise). An optional body may
// be empty (nil is returned), whatever its Content-Type.
func readBody(w http.ResponseWriter, r *http.Request, optional bool) ([]byte, *apiError) {
	if r.ContentLength > maxBodyBytes {
		return nil, tooLarge()
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return nil, tooLarge()
	case err != nil:
		return nil, &apiError{status: http.StatusBadRequest, code: apitypes.CodeInvalidJSON, msg: "the body could not be read: " + err.Error()}
	}
	if optional && len(bytes.TrimSpace(b)) == 0 {
		return nil, nil
	}
	ct := r.Header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return nil, &apiError{status: http.StatusUnsupportedMediaType, code: apitypes.CodeUnsupportedMediaType,
			msg: fmt.Sprintf("Content-Type %q: the body must be application/json", clip(ct))}
	}
	return b, nil
}

func tooLarge() *apiError {
	return &apiError{status: http.StatusRequestEntityTooLarge, code: apitypes.CodePayloadTooLarge,
		msg: fmt.Sprintf("the body is over %d bytes (1 MiB)", maxBodyBytes)}
}

// decodeStrict decodes one JSON value into v, refusing fields v does not
// have: 400 invalid_json for what is not JSON, 400 unknown_field, 422
// invalid_request for a value of the wrong type.
func decodeStrict(b []byte, v any) *apiError {
	if !json.Valid(b) {
		var x any
		err := json.Unmarshal(b, &x)
		msg := "the body is not JSON"
		if err != nil {
			msg += ": " + err.Error()
		} else {
			msg += ": it holds more than one value"
		}
		return &apiError{status: http.StatusBadRequest, code: apitypes.CodeInvalidJSON, msg: msg}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		return nil
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return &apiError{status: http.StatusBadRequest, code: apitypes.CodeUnknownField,
			msg: fmt.Sprintf("the body has the field %s, which the request does not have", f)}
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		at := "/" + strings.ReplaceAll(te.Field, ".", "/")
		return invalid("the body does not have the request's shape",
			fmt.Sprintf("at %s: want %s, got a JSON %s", at, te.Type, te.Value))
	}
	return invalid("the body does not have the request's shape", err.Error())
}

// problems splits a Validate error's "what: a; b; c" into its problems.
func problems(err error) []string {
	s := err.Error()
	if _, rest, ok := strings.Cut(s, ": "); ok {
		s = rest
	}
	return strings.Split(s, "; ")
}
