package policy_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/policy"
	"github.com/toolwire/toolwire/services/policy/pii"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestConfigFromEnv(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want policy.Config
		err  string
	}{
		{name: "defaults", want: policy.Config{Source: "/toolwire/policy", Concurrency: 32,
			ApprovalSweep: 500 * time.Millisecond, PreviewTimeout: 5 * time.Second, QueueWait: policy.DefaultQueueWait}},
		{name: "concurrency", env: map[string]string{policy.EnvConcurrency: "8"},
			want: policy.Config{Source: "/toolwire/policy", Concurrency: 8,
				ApprovalSweep: 500 * time.Millisecond, PreviewTimeout: 5 * time.Second, QueueWait: policy.DefaultQueueWait}},
		{name: "approval sweep and preview timeout",
			env: map[string]string{policy.EnvApprovalSweep: "50ms", policy.EnvPreviewTimeout: "2s"},
			want: policy.Config{Source: "/toolwire/policy", Concurrency: 32,
				ApprovalSweep: 50 * time.Millisecond, PreviewTimeout: 2 * time.Second, QueueWait: policy.DefaultQueueWait}},
		{name: "sweep not a duration", env: map[string]string{policy.EnvApprovalSweep: "often"},
			err: `TOOLWIRE_APPROVAL_SWEEP="often": want a duration from 10ms to 1m0s, for example 30s`},
		{name: "sweep too fast", env: map[string]string{policy.EnvApprovalSweep: "1ms"},
			err: `TOOLWIRE_APPROVAL_SWEEP="1ms": want a duration from 10ms to 1m0s, for example 30s`},
		{name: "preview timeout too long", env: map[string]string{policy.EnvPreviewTimeout: "1h"},
			err: `TOOLWIRE_PREVIEW_TIMEOUT="1h": want a duration from 1ms to 1m0s, for example 30s`},
		{name: "queue wait too long", env: map[string]string{policy.EnvQueueWait: "1h"},
			err: `TOOLWIRE_POLICY_QUEUE_WAIT="1h": want a duration from 10ms to 10m0s, for example 30s`},
		{name: "personal data", env: map[string]string{policy.EnvPII: "email, card", policy.EnvPIIOrgs: "acme=none; lab=all", policy.EnvPIIRegion: "gb"},
			want: policy.Config{Source: "/toolwire/policy", Concurrency: 32,
				ApprovalSweep: 500 * time.Millisecond, PreviewTimeout: 5 * time.Second, QueueWait: policy.DefaultQueueWait,
				PII: policy.PIIConfig{Kinds: []pii.Kind{pii.Email, pii.Card}, Orgs: map[string][]pii.Kind{"acme": {}, "lab": pii.Kinds()}, Region: "GB"}}},
		{name: "no personal data stripped", env: map[string]string{policy.EnvPII: "none"},
			want: policy.Config{Source: "/toolwire/policy", Concurrency: 32,
				ApprovalSweep: 500 * time.Millisecond, PreviewTimeout: 5 * time.Second, QueueWait: policy.DefaultQueueWait,
				PII: policy.PIIConfig{Kinds: []pii.Kind{}}}},
		{name: "an unknown kind", env: map[string]string{policy.EnvPII: "email,passport"},
			err: `TOOLWIRE_POLICY_PII="email,passport": pii kind "passport" is not one of all, none, email, iban, card, national_id, ip, phone`},
		{name: "an org without kinds", env: map[string]string{policy.EnvPIIOrgs: "acme"},
			err: `TOOLWIRE_POLICY_PII_ORGS="acme": "acme": want ORG=KINDS, such as acme=email,phone`},
		{name: "a region that is not", env: map[string]string{policy.EnvPIIRegion: "USA"},
			err: `TOOLWIRE_POLICY_PII_REGION="USA": want a two-letter region code such as GB`},
		{name: "not a number", env: map[string]string{policy.EnvConcurrency: "many"},
			err: `TOOLWIRE_POLICY_CONCURRENCY="many": want a whole number from 1 to 4096`},
		{name: "zero", env: map[string]string{policy.EnvConcurrency: "0"},
			err: `TOOLWIRE_POLICY_CONCURRENCY="0": want a whole number from 1 to 4096`},
		{name: "too many", env: map[string]string{policy.EnvConcurrency: "5000"},
			err: `TOOLWIRE_POLICY_CONCURRENCY="5000": want a whole number from 1 to 4096`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := policy.ConfigFromEnv(env(tt.env))
			if tt.err != "" {
				require.EqualError(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
			require.NoError(t, got.Validate())
		})
	}
}

func TestConfigValidate(t *testing.T) {
	require.NoError(t, policy.Config{}.Validate())
	require.EqualError(t, policy.Config{Concurrency: -1}.Validate(), "concurrency -1: want 1 to 4096")
	require.EqualError(t, policy.Config{ApprovalSweep: time.Millisecond}.Validate(), "approval sweep 1ms: want 10ms to 1m0s")
	require.EqualError(t, policy.Config{PreviewTimeout: -time.Second}.Validate(), "preview timeout -1s: want up to 1m0s")
}

func TestEnvVars(t *testing.T) {
	servicetest.VarsTakeEffect(t, policy.EnvVars(), policy.ConfigFromEnv)
}
