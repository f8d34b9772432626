-- A run can end cancelled (docs/agent-loop.md, Cancellation): its status
-- CHECK accepts it. A token can have the role producer (submits and cancels
-- its tenant's runs over the HTTP API, reads them, decides nothing).

-- +goose Up
ALTER TABLE runs DROP CONSTRAINT runs_status_check;
ALTER TABLE runs ADD CONSTRAINT runs_status_check
    CHECK (status IN ('requested', 'started', 'suspended', 'resumed', 'completed', 'failed', 'cancelled'));
ALTER TABLE tokens DROP CONSTRAINT tokens_role_check;
ALTER TABLE tokens ADD CONSTRAINT tokens_role_check CHECK (role IN ('viewer', 'producer', 'approver', 'admin'));

-- +goose Down
-- Fails while a run is cancelled or a token is a producer's: revoke or
-- delete those first.
ALTER TABLE tokens DROP CONSTRAINT tokens_role_check;
ALTER TABLE tokens ADD CONSTRAINT tokens_role_check CHECK (role IN ('viewer', 'approver', 'admin'));
ALTER TABLE runs DROP CONSTRAINT runs_status_check;
ALTER TABLE runs ADD CONSTRAINT runs_status_check
    CHECK (status IN ('requested', 'started', 'suspended', 'resumed', 'completed', 'failed'));
