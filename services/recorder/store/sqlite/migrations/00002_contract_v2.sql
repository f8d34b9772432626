-- Contract v2 (issue 15), as on Postgres (migrations 00004): a completed
-- run's outputs may be a blob, a tool call names its queue and carries its
-- cost. model_turns.turn holds the data of the turn events from now on (an
-- events.Turn); the rows recorded before keep their envelope.ModelTurn
-- (store.DecodeTurn reads both).

-- +goose Up
ALTER TABLE runs ADD COLUMN outputs_blob TEXT;
ALTER TABLE tool_calls ADD COLUMN queue TEXT;
ALTER TABLE tool_calls ADD COLUMN cost REAL;

-- +goose Down
ALTER TABLE tool_calls DROP COLUMN cost;
ALTER TABLE tool_calls DROP COLUMN queue;
ALTER TABLE runs DROP COLUMN outputs_blob;
