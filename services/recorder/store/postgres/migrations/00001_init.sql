-- The recorder's first schema: every consumed event, and the runs, tool calls,
-- model turns and verdicts materialized from them. Tables are unqualified: they
-- live in the connection's search_path, so that one database can hold several
-- recorders (and every test its own schema).
--
-- No foreign keys between the tables: events arrive on two streams with no
-- order between them, so a tool call may be recorded before its run.

-- +goose Up
CREATE TABLE events (
    event_id    text PRIMARY KEY,
    run_id      text,
    call_id     text,
    type        text        NOT NULL,
    subject     text        NOT NULL,
    source      text        NOT NULL,
    time        timestamptz NOT NULL,
    stream      text,
    stream_seq  bigint,
    extensions  jsonb,
    data        jsonb,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    -- recorded order: the timeline and its live stream page on it.
    seq         bigint GENERATED ALWAYS AS IDENTITY UNIQUE
);
CREATE INDEX events_run_idx ON events (run_id, seq);

CREATE TABLE runs (
    run_id       text PRIMARY KEY,
    org_id       text,
    workspace_id text,
    user_id      text,
    agent        text,
    status       text        NOT NULL DEFAULT 'requested'
        CHECK (status IN ('requested', 'started', 'suspended', 'resumed', 'completed', 'failed')),
    -- time of the event that set status: orders statuses of the same rank.
    status_at    timestamptz NOT NULL,
    request      jsonb,
    reason       text,
    outputs      jsonb,
    pinned       jsonb,
    trace_id     text,
    iterations   integer     NOT NULL DEFAULT 0,
    tool_calls   integer     NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    completed_at timestamptz
);
CREATE INDEX runs_created_idx ON runs (created_at DESC, run_id DESC);
CREATE INDEX runs_org_created_idx ON runs (org_id, created_at DESC, run_id DESC);
CREATE INDEX runs_org_agent_created_idx ON runs (org_id, agent, created_at DESC, run_id DESC);
CREATE INDEX runs_agent_created_idx ON runs (agent, created_at DESC, run_id DESC);
CREATE INDEX runs_status_created_idx ON runs (status, created_at DESC, run_id DESC);

CREATE TABLE tool_calls (
    run_id     text    NOT NULL,
    call_id    text    NOT NULL,
    seq        integer,
    iteration  integer,
    name       text,
    version    text,
    status     text    NOT NULL
        CHECK (status IN ('requested', 'approved', 'started', 'completed')),
    error_code text,
    input      jsonb,
    envelope   jsonb,
    t_start    timestamptz,
    t_end      timestamptz,
    latency_ms bigint,
    cached     boolean NOT NULL DEFAULT false,
    truncated  boolean NOT NULL DEFAULT false,
    PRIMARY KEY (run_id, call_id)
);
CREATE INDEX tool_calls_name_idx ON tool_calls (name, version);

CREATE TABLE model_turns (
    run_id    text    NOT NULL,
    iteration integer NOT NULL,
    turn      jsonb   NOT NULL,
    PRIMARY KEY (run_id, iteration)
);

CREATE TABLE verdicts (
    run_id    text    NOT NULL,
    iteration integer NOT NULL,
    allowed   boolean NOT NULL,
    code      text,
    reason    text,
    PRIMARY KEY (run_id, iteration)
);

-- +goose Down
DROP TABLE verdicts;
DROP TABLE model_turns;
DROP TABLE tool_calls;
DROP TABLE runs;
DROP TABLE events;
