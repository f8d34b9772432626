-- Events are keyed per run (issue 29), as on Postgres (migration 00007):
-- (run_id, event_id), with coalesce(run_id, '') for an event of no run.
-- SQLite cannot drop a column's UNIQUE constraint, so both tables are
-- rebuilt, their rows (and their seq, the recorded order) kept.

-- +goose Up
CREATE TABLE events_per_run (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id    TEXT    NOT NULL,
    run_id      TEXT,
    call_id     TEXT,
    type        TEXT    NOT NULL,
    subject     TEXT    NOT NULL,
    source      TEXT    NOT NULL,
    time        TEXT    NOT NULL,
    stream      TEXT,
    stream_seq  INTEGER,
    extensions  TEXT,
    data        TEXT,
    recorded_at TEXT    NOT NULL
);
INSERT INTO events_per_run (seq, event_id, run_id, call_id, type, subject, source, time, stream, stream_seq,
    extensions, data, recorded_at)
SELECT seq, event_id, run_id, call_id, type, subject, source, time, stream, stream_seq, extensions, data, recorded_at
FROM events ORDER BY seq;
DROP TABLE events;
ALTER TABLE events_per_run RENAME TO events;
CREATE INDEX events_run_idx ON events (run_id, seq);
CREATE UNIQUE INDEX events_run_event_idx ON events (coalesce(run_id, ''), event_id);

CREATE TABLE parked_per_run (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT    NOT NULL,
    run_id   TEXT    NOT NULL,
    record   TEXT    NOT NULL,
    UNIQUE (run_id, event_id)
);
INSERT INTO parked_per_run (seq, event_id, run_id, record)
SELECT seq, event_id, run_id, record FROM parked_events ORDER BY seq;
DROP TABLE parked_events;
ALTER TABLE parked_per_run RENAME TO parked_events;
CREATE INDEX parked_events_run_idx ON parked_events (run_id, seq);

-- +goose Down
-- Fails when two runs hold events of one id, which only this version could
-- store.
CREATE TABLE events_by_id (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id    TEXT    NOT NULL UNIQUE,
    run_id      TEXT,
    call_id     TEXT,
    type        TEXT    NOT NULL,
    subject     TEXT    NOT NULL,
    source      TEXT    NOT NULL,
    time        TEXT    NOT NULL,
    stream      TEXT,
    stream_seq  INTEGER,
    extensions  TEXT,
    data        TEXT,
    recorded_at TEXT    NOT NULL
);
INSERT INTO events_by_id SELECT seq, event_id, run_id, call_id, type, subject, source, time, stream, stream_seq,
    extensions, data, recorded_at FROM events ORDER BY seq;
DROP TABLE events;
ALTER TABLE events_by_id RENAME TO events;
CREATE INDEX events_run_idx ON events (run_id, seq);

CREATE TABLE parked_by_id (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT    NOT NULL UNIQUE,
    run_id   TEXT    NOT NULL,
    record   TEXT    NOT NULL
);
INSERT INTO parked_by_id SELECT seq, event_id, run_id, record FROM parked_events ORDER BY seq;
DROP TABLE parked_events;
ALTER TABLE parked_by_id RENAME TO parked_events;
CREATE INDEX parked_events_run_idx ON parked_events (run_id, seq);
