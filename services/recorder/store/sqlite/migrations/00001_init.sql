-- The recorder's schema on SQLite (the embedded store of `toolwire dev`): the
-- same tables and rules as on Postgres (migrations/*.sql), in SQLite's types.
-- Times are fixed-width UTC text (2006-01-02T15:04:05.000000000Z), so that
-- they compare in time order as strings; JSON documents are text.
--
-- No foreign keys between the tables: events arrive on two streams with no
-- order between them, so a tool call may be recorded before its run.

-- +goose Up
CREATE TABLE events (
    -- recorded order: the timeline and its live stream page on it.
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
CREATE INDEX events_run_idx ON events (run_id, seq);

CREATE TABLE runs (
    run_id       TEXT PRIMARY KEY,
    org_id       TEXT,
    workspace_id TEXT,
    user_id      TEXT,
    agent        TEXT,
    status       TEXT    NOT NULL DEFAULT 'requested'
        CHECK (status IN ('requested', 'started', 'suspended', 'resumed', 'completed', 'failed')),
    status_at    TEXT    NOT NULL,
    request      TEXT,
    reason       TEXT,
    outputs      TEXT,
    pinned       TEXT,
    trace_id     TEXT,
    iterations   INTEGER NOT NULL DEFAULT 0,
    tool_calls   INTEGER NOT NULL DEFAULT 0,
    spend        REAL,
    created_at   TEXT    NOT NULL,
    updated_at   TEXT    NOT NULL,
    completed_at TEXT
);
CREATE INDEX runs_created_idx ON runs (created_at DESC, run_id DESC);
CREATE INDEX runs_org_created_idx ON runs (org_id, created_at DESC, run_id DESC);
CREATE INDEX runs_org_agent_created_idx ON runs (org_id, agent, created_at DESC, run_id DESC);
CREATE INDEX runs_agent_created_idx ON runs (agent, created_at DESC, run_id DESC);
CREATE INDEX runs_status_created_idx ON runs (status, created_at DESC, run_id DESC);

CREATE TABLE tool_calls (
    run_id     TEXT    NOT NULL,
    call_id    TEXT    NOT NULL,
    seq        INTEGER,
    iteration  INTEGER,
    name       TEXT,
    version    TEXT,
    status     TEXT    NOT NULL
        CHECK (status IN ('requested', 'approved', 'started', 'completed')),
    error_code TEXT,
    input      TEXT,
    envelope   TEXT,
    t_start    TEXT,
    t_end      TEXT,
    latency_ms INTEGER,
    cached     BOOLEAN NOT NULL DEFAULT 0,
    truncated  BOOLEAN NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, call_id)
);

CREATE TABLE model_turns (
    run_id    TEXT    NOT NULL,
    iteration INTEGER NOT NULL,
    turn      TEXT    NOT NULL,
    PRIMARY KEY (run_id, iteration)
);

CREATE TABLE verdicts (
    run_id    TEXT    NOT NULL,
    iteration INTEGER NOT NULL,
    allowed   BOOLEAN NOT NULL,
    code      TEXT,
    reason    TEXT,
    PRIMARY KEY (run_id, iteration)
);

CREATE TABLE run_tools (
    run_id     TEXT NOT NULL,
    name       TEXT NOT NULL,
    version    TEXT NOT NULL,
    definition TEXT NOT NULL,
    PRIMARY KEY (run_id, name, version)
);

-- +goose Down
DROP TABLE run_tools;
DROP TABLE verdicts;
DROP TABLE model_turns;
DROP TABLE tool_calls;
DROP TABLE runs;
DROP TABLE events;
