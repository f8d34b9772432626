package embedded

import (
	"slices"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/toolwire/toolwire/pkg/service/identity"
)

// Users are the nkey users of keys (server.Options.Nkeys), each limited to
// its role's or tenant's subjects, for Options.Users.
func Users(keys *identity.Keys) []*server.NkeyUser {
	var out []*server.NkeyUser
	for _, u := range keys.Users() {
		out = append(out, &server.NkeyUser{Nkey: u.PublicKey, Permissions: permissions(u.Permissions)})
	}
	return out
}

func permissions(p identity.Permissions) *server.Permissions {
	sp := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: slices.Clone(p.Publish), Deny: slices.Clone(p.PublishDeny)},
		Subscribe: &server.SubjectPermission{Allow: slices.Clone(p.Subscribe)},
	}
	if p.Responses {
		sp.Response = &server.ResponsePermission{MaxMsgs: 1, Expires: time.Minute}
	}
	return sp
}
