-- Documents are kept as json, not jsonb: exactly the text that was sent,
-- checked for being JSON and not taken apart. Nothing queries inside them
-- (the API, the pages and the replay bundles read each one whole), and
-- building jsonb was the largest part of the Postgres CPU a recorded event
-- cost: about 15 of 38 µs for a 700-byte document in the events insert
-- alone, paid again for the tool call's input and envelope. json also holds
-- what jsonb refuses, such as a string with \u0000, so fewer events are
-- dead-lettered as unstorable.
--
-- tool_calls and runs are updated by every event of a call and every batch of
-- a run: a third of each page is left free so that an update that changes no
-- indexed column (most of a call's; a run's that leave its status, tenant and
-- agent) can stay on its page and skip the indexes (HOT). Over ten rounds of
-- BenchmarkPostgresWrite's interleaved batches, HOT updates went from 5% to
-- 61% of the runs updates and from 12% to 67% of the tool_calls ones. Each
-- table is rewritten once, in the statement that sets both.
--
-- The rewrite holds each table's ACCESS EXCLUSIVE lock and needs room for a
-- second copy of it; on a large events table, recorders wait for it at start.

-- +goose Up
ALTER TABLE events ALTER COLUMN data TYPE json USING data::json,
    ALTER COLUMN extensions TYPE json USING extensions::json;
ALTER TABLE tool_calls ALTER COLUMN input TYPE json USING input::json,
    ALTER COLUMN envelope TYPE json USING envelope::json,
    SET (fillfactor = 70);
ALTER TABLE model_turns ALTER COLUMN turn TYPE json USING turn::json;
ALTER TABLE run_tools ALTER COLUMN definition TYPE json USING definition::json;
ALTER TABLE runs ALTER COLUMN request TYPE json USING request::json,
    ALTER COLUMN outputs TYPE json USING outputs::json,
    ALTER COLUMN pinned TYPE json USING pinned::json,
    SET (fillfactor = 70);

-- +goose Down
-- Back to jsonb; it fails on a document jsonb cannot hold (a \u0000 that json
-- accepted), which must then be edited or deleted first.
ALTER TABLE runs RESET (fillfactor);
ALTER TABLE tool_calls RESET (fillfactor);
ALTER TABLE runs ALTER COLUMN request TYPE jsonb USING request::jsonb,
    ALTER COLUMN outputs TYPE jsonb USING outputs::jsonb,
    ALTER COLUMN pinned TYPE jsonb USING pinned::jsonb;
ALTER TABLE run_tools ALTER COLUMN definition TYPE jsonb USING definition::jsonb;
ALTER TABLE model_turns ALTER COLUMN turn TYPE jsonb USING turn::jsonb;
ALTER TABLE tool_calls ALTER COLUMN input TYPE jsonb USING input::jsonb,
    ALTER COLUMN envelope TYPE jsonb USING envelope::jsonb;
ALTER TABLE events ALTER COLUMN data TYPE jsonb USING data::jsonb,
    ALTER COLUMN extensions TYPE jsonb USING extensions::jsonb;
