package orchestrator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"strings"

	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/orchestrator/provider/replay"
	"github.com/toolwire/toolwire/services/orchestrator/provider/scripted"
)

// EnvPrices configures the model price table: a JSON object, or the path of a
// file holding one, mapping a model ("gpt-4o", or "provider/model" to price
// one provider's model only) to its price per million input and output tokens.
// Its entries replace the defaults of the same key; the rest stay.
const EnvPrices = "TOOLWIRE_PRICES"

// Price is what a model charges per million tokens, in the table's unit (USD
// for the defaults).
type Price struct {
	InputPerMTok  float64 `json:"input_per_mtok"`
	OutputPerMTok float64 `json:"output_per_mtok"`
}

// Cost is the price of a call with these token counts.
func (p Price) Cost(inputTokens, outputTokens int) float64 {
	return (float64(inputTokens)*p.InputPerMTok + float64(outputTokens)*p.OutputPerMTok) / 1e6
}

// Prices is the model price table, keyed by model name or "provider/model".
type Prices map[string]Price

// DefaultPrices are list prices in USD per million tokens of some well-known
// models, as published by their providers when this table was written. They
// change: set TOOLWIRE_PRICES to your own. A dated model version
// ("claude-sonnet-4-5-20250929") takes the price of its undated name.
func DefaultPrices() Prices {
	return Prices{
		"gpt-4o":            {InputPerMTok: 2.50, OutputPerMTok: 10.00},
		"gpt-4o-mini":       {InputPerMTok: 0.15, OutputPerMTok: 0.60},
		"gpt-4.1":           {InputPerMTok: 2.00, OutputPerMTok: 8.00},
		"gpt-4.1-mini":      {InputPerMTok: 0.40, OutputPerMTok: 1.60},
		"gpt-4.1-nano":      {InputPerMTok: 0.10, OutputPerMTok: 0.40},
		"o3-mini":           {InputPerMTok: 1.10, OutputPerMTok: 4.40},
		"o4-mini":           {InputPerMTok: 1.10, OutputPerMTok: 4.40},
		"claude-opus-4-1":   {InputPerMTok: 15.00, OutputPerMTok: 75.00},
		"claude-opus-4":     {InputPerMTok: 15.00, OutputPerMTok: 75.00},
		"claude-sonnet-4-5": {InputPerMTok: 3.00, OutputPerMTok: 15.00},
		"claude-sonnet-4":   {InputPerMTok: 3.00, OutputPerMTok: 15.00},
		"claude-haiku-4-5":  {InputPerMTok: 1.00, OutputPerMTok: 5.00},
		"claude-3-5-haiku":  {InputPerMTok: 0.80, OutputPerMTok: 4.00},
		"claude-3-haiku":    {InputPerMTok: 0.25, OutputPerMTok: 1.25},
	}
}

// freeProviders are the providers whose models cost nothing unless the table
// prices them: the scripted model and replays of recorded runs.
var freeProviders = map[string]bool{scripted.Name: true, replay.Name: true}

// For returns the price of provider's model and whether it is known: the
// entry "provider/model", else "model", else the longest key that model
// starts with followed by '-' (a dated version of a priced model). The
// scripted and replay providers are free unless priced.
func (p Prices) For(provider, model string) (Price, bool) {
	if pr, ok := p[provider+"/"+model]; ok {
		return pr, true
	}
	if pr, ok := p[model]; ok {
		return pr, true
	}
	// The longest matching model name wins; at equal length, the
	// provider's own entry.
	best, bestLen, found := "", -1, false
	for k := range p {
		scoped := strings.Contains(k, "/")
		if scoped && !strings.HasPrefix(k, provider+"/") {
			continue
		}
		name := strings.TrimPrefix(k, provider+"/")
		if !strings.HasPrefix(model, name+"-") {
			continue
		}
		if len(name) > bestLen || len(name) == bestLen && scoped {
			best, bestLen, found = k, len(name), true
		}
	}
	if found {
		return p[best], true
	}
	if freeProviders[provider] {
		return Price{}, true
	}
	return Price{}, false
}

// Validate checks that every price is a finite number, zero or more.
func (p Prices) Validate() error {
	var problems []string
	for k, v := range p {
		if strings.TrimSpace(k) == "" {
			problems = append(problems, "an entry has an empty model name")
		}
		for _, f := range []float64{v.InputPerMTok, v.OutputPerMTok} {
			if f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
				problems = append(problems, fmt.Sprintf("%q: prices must be finite numbers, zero or more", k))
				break
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("price table: %s", strings.Join(problems, "; "))
	}
	return nil
}

// ParsePrices reads a price table from JSON, rejecting unknown fields.
func ParsePrices(b []byte) (Prices, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var p Prices
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("price table: want {\"model\": {\"input_per_mtok\": n, \"output_per_mtok\": n}, ...}: %w", err)
	}
	if dec.More() {
		return nil, errors.New("price table: trailing content after the JSON object")
	}
	return p, p.Validate()
}

// readPrices applies EnvPrices (inline JSON or a file name) over prices.
func readPrices(e *service.Env, prices Prices) {
	v, ok := e.Lookup(EnvPrices)
	if !ok {
		return
	}
	b := []byte(v)
	if !strings.HasPrefix(v, "{") {
		var err error
		if b, err = os.ReadFile(v); err != nil {
			e.Check(EnvPrices, v, err)
			return
		}
	}
	extra, err := ParsePrices(b)
	if err != nil {
		e.Check(EnvPrices, v, err)
		return
	}
	maps.Copy(prices, extra)
}
