-- Parked events (issue 18): the record of an event that waits for its run's
-- request or for the model turn that requests its call (store.Admit). Events
-- arrive on two streams in any order, so a call's completion may be consumed
-- before its turn and a run's start before its request; their effects wait
-- here, in the order they were parked, and apply when the request or the turn
-- is recorded. A forged or stray event (a call no turn made, a run never
-- requested) waits here for good, and changes no run. The event itself is in
-- events, as always.
--
-- record is a store.Record as store.EncodeParked wrote it (JSON, kept as
-- text: nothing queries inside it).

-- +goose Up
CREATE TABLE parked_events (
    seq      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id text NOT NULL UNIQUE,
    run_id   text NOT NULL,
    record   text NOT NULL
);
CREATE INDEX parked_events_run_idx ON parked_events (run_id, seq);

-- +goose Down
DROP TABLE parked_events;
