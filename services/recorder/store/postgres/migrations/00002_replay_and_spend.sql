-- The replay bundle's tool definitions as called, a run's spend, and the
-- indexes of the API's new filters and of stale_last_success pins.

-- +goose Up
ALTER TABLE runs ADD COLUMN spend double precision;

-- The definition of every tool version a run's model was offered, as the
-- registry held it when the model was called (the first recorded wins).
CREATE TABLE run_tools (
    run_id     text  NOT NULL,
    name       text  NOT NULL,
    version    text  NOT NULL,
    definition jsonb NOT NULL,
    PRIMARY KEY (run_id, name, version)
);

-- The transaction that recorded an event. Several recorder replicas commit
-- concurrently, so an event can become visible after one with a higher seq;
-- the live stream only reads events whose transaction is older than every
-- transaction still running (pg_snapshot_xmin), so that it never skips one.
-- Rows recorded before this column have NULL: long settled.
ALTER TABLE events ADD COLUMN txid xid8;
ALTER TABLE events ALTER COLUMN txid SET DEFAULT pg_current_xact_id();

-- The last successful run of one agent node (stale_last_success pins).
CREATE INDEX runs_node_completed_idx ON runs (org_id, agent, created_at DESC, run_id DESC)
    WHERE status = 'completed';
CREATE INDEX runs_ws_created_idx ON runs (workspace_id, created_at DESC, run_id DESC);

-- +goose Down
DROP INDEX runs_ws_created_idx;
DROP INDEX runs_node_completed_idx;
DROP TABLE run_tools;
ALTER TABLE events DROP COLUMN txid;
ALTER TABLE runs DROP COLUMN spend;
