-- A run can end cancelled and a token can be a producer's, as on Postgres
-- (migration 00008). SQLite cannot change a CHECK constraint, so both tables
-- are rebuilt, their rows kept.

-- +goose Up
CREATE TABLE runs_new (
    run_id       TEXT PRIMARY KEY,
    org_id       TEXT,
    workspace_id TEXT,
    user_id      TEXT,
    agent        TEXT,
    status       TEXT    NOT NULL DEFAULT 'requested'
        CHECK (status IN ('requested', 'started', 'suspended', 'resumed', 'completed', 'failed', 'cancelled')),
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
    completed_at TEXT,
    outputs_blob TEXT
);
INSERT INTO runs_new (run_id, org_id, workspace_id, user_id, agent, status, status_at, request, reason, outputs, pinned, trace_id, iterations, tool_calls, spend, created_at, updated_at, completed_at, outputs_blob)
SELECT run_id, org_id, workspace_id, user_id, agent, status, status_at, request, reason, outputs, pinned, trace_id, iterations, tool_calls, spend, created_at, updated_at, completed_at, outputs_blob FROM runs;
DROP TABLE runs;
ALTER TABLE runs_new RENAME TO runs;
CREATE INDEX runs_created_idx ON runs (created_at DESC, run_id DESC);
CREATE INDEX runs_org_created_idx ON runs (org_id, created_at DESC, run_id DESC);
CREATE INDEX runs_org_agent_created_idx ON runs (org_id, agent, created_at DESC, run_id DESC);
CREATE INDEX runs_agent_created_idx ON runs (agent, created_at DESC, run_id DESC);
CREATE INDEX runs_status_created_idx ON runs (status, created_at DESC, run_id DESC);

CREATE TABLE tokens_new (
    token_id     TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    org_id       TEXT NOT NULL,
    workspace_id TEXT NOT NULL DEFAULT '',
    role         TEXT NOT NULL CHECK (role IN ('viewer', 'producer', 'approver', 'admin')),
    hash         BLOB NOT NULL,
    created_at   TEXT NOT NULL,
    expires_at   TEXT,
    revoked_at   TEXT
);
INSERT INTO tokens_new (token_id, name, org_id, workspace_id, role, hash, created_at, expires_at, revoked_at)
SELECT token_id, name, org_id, workspace_id, role, hash, created_at, expires_at, revoked_at FROM tokens;
DROP TABLE tokens;
ALTER TABLE tokens_new RENAME TO tokens;

-- +goose Down
-- Fails while a run is cancelled or a token is a producer's.
CREATE TABLE runs_new (
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
    completed_at TEXT,
    outputs_blob TEXT
);
INSERT INTO runs_new (run_id, org_id, workspace_id, user_id, agent, status, status_at, request, reason, outputs, pinned, trace_id, iterations, tool_calls, spend, created_at, updated_at, completed_at, outputs_blob)
SELECT run_id, org_id, workspace_id, user_id, agent, status, status_at, request, reason, outputs, pinned, trace_id, iterations, tool_calls, spend, created_at, updated_at, completed_at, outputs_blob FROM runs;
DROP TABLE runs;
ALTER TABLE runs_new RENAME TO runs;
CREATE INDEX runs_created_idx ON runs (created_at DESC, run_id DESC);
CREATE INDEX runs_org_created_idx ON runs (org_id, created_at DESC, run_id DESC);
CREATE INDEX runs_org_agent_created_idx ON runs (org_id, agent, created_at DESC, run_id DESC);
CREATE INDEX runs_agent_created_idx ON runs (agent, created_at DESC, run_id DESC);
CREATE INDEX runs_status_created_idx ON runs (status, created_at DESC, run_id DESC);

CREATE TABLE tokens_new (
    token_id     TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    org_id       TEXT NOT NULL,
    workspace_id TEXT NOT NULL DEFAULT '',
    role         TEXT NOT NULL CHECK (role IN ('viewer', 'approver', 'admin')),
    hash         BLOB NOT NULL,
    created_at   TEXT NOT NULL,
    expires_at   TEXT,
    revoked_at   TEXT
);
INSERT INTO tokens_new (token_id, name, org_id, workspace_id, role, hash, created_at, expires_at, revoked_at)
SELECT token_id, name, org_id, workspace_id, role, hash, created_at, expires_at, revoked_at FROM tokens;
DROP TABLE tokens;
ALTER TABLE tokens_new RENAME TO tokens;
