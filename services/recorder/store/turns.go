package store

import (
	"encoding/json"
	"fmt"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// TurnDoc is a recorded model turn, whichever contract recorded it: the data
// of its turn event (contract v2), or the envelope.ModelTurn of the
// llm.completed event a run recorded before contract v2 had instead. Exactly
// one of Turn and Legacy is set.
type TurnDoc struct {
	Iteration int
	Turn      *events.Turn
	Legacy    *envelope.ModelTurn
}

// DecodeTurn reads a turn row. A turn event's data names its run and carries
// the loop rules' verdict; a ModelTurn has neither.
func DecodeTurn(t TurnRow) (TurnDoc, error) {
	var probe struct {
		RunID   *string         `json:"run_id"`
		Verdict json.RawMessage `json:"verdict"`
	}
	if err := json.Unmarshal(t.Turn, &probe); err != nil {
		return TurnDoc{}, fmt.Errorf("turn %d of run %q: %w", t.Iteration, t.RunID, err)
	}
	doc := TurnDoc{Iteration: t.Iteration}
	if probe.RunID != nil || probe.Verdict != nil {
		doc.Turn = new(events.Turn)
		if err := json.Unmarshal(t.Turn, doc.Turn); err != nil {
			return TurnDoc{}, fmt.Errorf("turn %d of run %q: %w", t.Iteration, t.RunID, err)
		}
		return doc, nil
	}
	doc.Legacy = new(envelope.ModelTurn)
	if err := json.Unmarshal(t.Turn, doc.Legacy); err != nil {
		return TurnDoc{}, fmt.Errorf("turn %d of run %q: %w", t.Iteration, t.RunID, err)
	}
	return doc, nil
}

// Response is the model's answer; nil for a turn the loop rules denied (the
// model was not called).
func (d TurnDoc) Response() *envelope.ModelResponse {
	if d.Legacy != nil {
		return &d.Legacy.Response
	}
	return d.Turn.Response
}

// ModelTurn is the turn as a replay bundle holds it: model is the run
// request's (a turn event names its model without the options, which may
// hold a whole script). A turn recorded before contract v2 keeps its
// messages. False for a denied turn, which called no model.
func (d TurnDoc) ModelTurn(model envelope.Model) (envelope.ModelTurn, bool) {
	if d.Legacy != nil {
		return *d.Legacy, true
	}
	t := d.Turn
	if t.Response == nil {
		return envelope.ModelTurn{}, false
	}
	return envelope.ModelTurn{Iteration: t.Iteration, Model: model, Tools: t.Tools, Response: *t.Response,
		TStart: t.TStart, TEnd: t.TEnd}, true
}
