-- API tokens (issue 19): the recorder's API and pages authenticate with them.
-- A token is never stored: only its public id and the SHA-256 of its secret
-- (package auth). org_id '*' is an operator's token for every tenant;
-- workspace_id '' covers every workspace of the org.

-- +goose Up
CREATE TABLE tokens (
    token_id     text        PRIMARY KEY,
    name         text        NOT NULL,
    org_id       text        NOT NULL,
    workspace_id text        NOT NULL DEFAULT '',
    role         text        NOT NULL CHECK (role IN ('viewer', 'approver', 'admin')),
    hash         bytea       NOT NULL,
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz,
    revoked_at   timestamptz
);

-- +goose Down
DROP TABLE tokens;
