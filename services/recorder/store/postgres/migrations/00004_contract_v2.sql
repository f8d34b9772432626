-- Contract v2 (issue 15): a completed run's outputs may be a blob, a tool
-- call names its queue and carries its cost, and a model turn is the data of
-- its turn event.
--
-- model_turns.turn keeps the data of the run's turn events (an events.Turn:
-- the loop rules' verdict, the response, its cost and the calls) for the runs
-- recorded from now on; the rows recorded before hold the envelope.ModelTurn
-- of their llm.completed events and stay as they are (store.DecodeTurn reads
-- both). verdicts now holds the loop rules' verdict each turn carries.
--
-- New columns are NULL for the rows recorded before: adding them rewrites
-- nothing.

-- +goose Up
-- The events.OutputsDocument blob a completed run's event named instead of
-- carrying its outputs (an envelope.Attachment, as received).
ALTER TABLE runs ADD COLUMN outputs_blob json;
-- The queue the call was routed to (its approved event), and what it cost
-- the run (its envelope).
ALTER TABLE tool_calls ADD COLUMN queue text, ADD COLUMN cost double precision;

-- +goose Down
ALTER TABLE tool_calls DROP COLUMN cost, DROP COLUMN queue;
ALTER TABLE runs DROP COLUMN outputs_blob;
