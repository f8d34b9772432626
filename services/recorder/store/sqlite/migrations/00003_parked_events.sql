-- Parked events (issue 18), as on Postgres (migrations 00005): the record of
-- an event that waits for its run's request or its call's turn
-- (store.Admit), in the order it was parked.

-- +goose Up
CREATE TABLE parked_events (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT    NOT NULL UNIQUE,
    run_id   TEXT    NOT NULL,
    record   TEXT    NOT NULL
);
CREATE INDEX parked_events_run_idx ON parked_events (run_id, seq);

-- +goose Down
DROP TABLE parked_events;
