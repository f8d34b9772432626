package events

import (
	"strings"

	"github.com/cloudevents/sdk-go/v2/event"
)

// validate is event.Event.Validate without its cost where nothing is wrong:
// the SDK's check allocates a map of errors, re-serializes the source URI
// and parses the media type on every call, and every hop validates an
// event three times (built, encoded, decoded). An event whose attributes
// pass the plain checks below is valid by the SDK's rules too; any other
// is handed to the SDK, whose error message is the one returned.
func validate(e *event.Event) error {
	if len(e.FieldErrors) == 0 { // a setter's error is reported by the SDK
		if ec, ok := e.Context.(*event.EventContextV1); ok && plainlyValid(ec) {
			return nil
		}
	}
	if err := e.Validate(); err != nil {
		return err
	}
	return nil
}

// plainlyValid reports whether ec passes the checks of the SDK's
// EventContextV1.Validate by a shorter road; false means "not shown", not
// "invalid".
func plainlyValid(ec *event.EventContextV1) bool {
	if blank(ec.ID) || blank(ec.Type) {
		return false
	}
	// A URI reference with any part set re-serializes to a non-blank
	// string: spaces in a path, query or fragment come back escaped.
	u := &ec.Source.URL
	if u.Scheme == "" && u.Opaque == "" && u.Host == "" && u.Path == "" && u.RawQuery == "" && u.Fragment == "" {
		return false
	}
	if ec.DataContentType != nil && *ec.DataContentType != event.ApplicationJSON {
		return false // the SDK parses any other media type
	}
	if ec.DataSchema != nil && !ec.DataSchema.Validate() {
		return false
	}
	if ec.Subject != nil && blank(*ec.Subject) {
		return false
	}
	return true
}

func blank(s string) bool { return strings.TrimSpace(s) == "" }

// mediaType is e's data media type without parameters, read in place.
func mediaType(e *event.Event) string {
	if ec, ok := e.Context.(*event.EventContextV1); ok {
		if ec.DataContentType == nil {
			return ""
		}
		ct := *ec.DataContentType
		if i := strings.IndexByte(ct, ';'); i >= 0 {
			return strings.TrimSpace(ct[:i])
		}
		return ct
	}
	return e.DataMediaType()
}
