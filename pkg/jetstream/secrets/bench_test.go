package secrets_test

import (
	"encoding/json"
	"math/rand/v2"
	"net/url"
	"sort"
	"strings"
	"testing"

	"github.com/toolwire/toolwire/pkg/jetstream/secrets"
)

// legacyScrubber is the scrubber before encodings were scrubbed (exact,
// URL- and JSON-escaped spellings through a strings.Replacer), kept to
// compare speed with.
type legacyScrubber struct {
	pairs []string
	r     *strings.Replacer
}

func newLegacyScrubber(values map[string]string) *legacyScrubber {
	type pat struct{ old, repl string }
	var pats []pat
	seen := map[string]bool{}
	esc := func(v string) string { b, _ := json.Marshal(v); return string(b[1 : len(b)-1]) }
	for name, v := range values {
		repl := "[REDACTED:" + name + "]"
		j := esc(v)
		for _, variant := range []string{v, url.QueryEscape(v), url.PathEscape(v), j, esc(j)} {
			if variant != "" && !seen[variant] {
				seen[variant] = true
				pats = append(pats, pat{variant, repl})
			}
		}
	}
	sort.SliceStable(pats, func(i, j int) bool { return len(pats[i].old) > len(pats[j].old) })
	s := &legacyScrubber{}
	for _, p := range pats {
		s.pairs = append(s.pairs, p.old, p.repl)
	}
	s.r = strings.NewReplacer(s.pairs...)
	return s
}

func (s *legacyScrubber) String(v string) string { return s.r.Replace(v) }

func (s *legacyScrubber) Contains(v string) bool {
	for i := 0; i < len(s.pairs); i += 2 {
		if strings.Contains(v, s.pairs[i]) {
			return true
		}
	}
	return false
}

var benchSecrets = map[string]string{
	"API_KEY":  "sk-live-4eC39HqLyjWDarjtT1zdp7dc",
	"DB_PASS":  "correct horse/battery+staple",
	"GH_TOKEN": "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
}

// benchOutput is 64 KiB of JSON-ish tool output; with the secrets, each
// appears (raw) twice.
func benchOutput(withSecrets bool) string {
	rng := rand.New(rand.NewPCG(7, 7))
	words := []string{"id", "name", "status", "ok", "items", "2026-12-01T22:50:44Z", "https://api.example.com/v1/things?page=2",
		"0", "17", "true", "description", "lorem", "ipsum", "dolor", "sit", "amet", "e3b0c44298fc1c149afbf4c8996fb924", "user@example.com"}
	var b strings.Builder
	b.WriteString(`{"items":[`)
	for b.Len() < 64<<10-200 {
		b.WriteString(`{"k":"`)
		for i := 0; i < 8; i++ {
			b.WriteString(words[rng.IntN(len(words))])
			b.WriteByte(' ')
		}
		b.WriteString(`"},`)
	}
	s := b.String()
	if withSecrets {
		names := []string{"API_KEY", "DB_PASS", "GH_TOKEN"}
		for i, n := range names {
			for j := 0; j < 2; j++ {
				at := (len(s) / 7) * (2*i + j + 1)
				at = strings.LastIndexByte(s[:at], ' ') + 1
				s = s[:at] + benchSecrets[n] + " " + s[at:]
			}
		}
	}
	return s + `{}]}`
}

func BenchmarkScrub(b *testing.B) {
	for _, c := range []struct {
		name        string
		withSecrets bool
	}{{"secrets", true}, {"clean", false}} {
		in := benchOutput(c.withSecrets)
		newS, oldS := secrets.NewScrubber(benchSecrets), newLegacyScrubber(benchSecrets)
		b.Run("String/"+c.name+"/new", func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			for b.Loop() {
				newS.String(in)
			}
		})
		b.Run("String/"+c.name+"/legacy", func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			for b.Loop() {
				oldS.String(in)
			}
		})
		b.Run("Contains/"+c.name+"/new", func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			for b.Loop() {
				newS.Contains(in)
			}
		})
		b.Run("Contains/"+c.name+"/legacy", func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			for b.Loop() {
				oldS.Contains(in)
			}
		})
	}
	b.Run("NewScrubber/new", func(b *testing.B) {
		for b.Loop() {
			secrets.NewScrubber(benchSecrets)
		}
	})
	b.Run("NewScrubber/legacy", func(b *testing.B) {
		for b.Loop() {
			newLegacyScrubber(benchSecrets)
		}
	})
}
