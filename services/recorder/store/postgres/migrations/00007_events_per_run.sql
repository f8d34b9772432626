-- Events are keyed per run (issue 29): (run_id, event_id), no longer by
-- event id alone. An event id says what the event announces within its run
-- (<run_id>/<call_id>/completed, <run_id>/turn/<n>); keyed by the id alone,
-- an event stored under one run could hold the id of another run's event to
-- come, and that event was then taken for a redelivery and dropped. The
-- recorder takes an event's run from its subject (store.RecordOf), so the
-- key names the run the event was delivered for. An event of no run (not
-- on a toolwire subject) has run_id NULL, one key for all such: the index
-- is on coalesce(run_id, ''), which every Postgres version can hold.
--
-- On a large events table the new index takes a while to build, and the
-- recorders wait for it at start.

-- +goose Up
CREATE UNIQUE INDEX events_run_event_idx ON events ((coalesce(run_id, '')), event_id);
ALTER TABLE events DROP CONSTRAINT events_pkey;

ALTER TABLE parked_events ADD CONSTRAINT parked_events_run_event_key UNIQUE (run_id, event_id);
ALTER TABLE parked_events DROP CONSTRAINT parked_events_event_id_key;

-- +goose Down
-- Fails when two runs hold events of one id, which only this version could
-- store.
ALTER TABLE parked_events ADD CONSTRAINT parked_events_event_id_key UNIQUE (event_id);
ALTER TABLE parked_events DROP CONSTRAINT parked_events_run_event_key;

ALTER TABLE events ADD CONSTRAINT events_pkey PRIMARY KEY (event_id);
DROP INDEX events_run_event_idx;
