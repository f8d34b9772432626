-- API tokens (issue 19), as on Postgres (migration 00005): only the public id
-- and the SHA-256 of the secret are kept.

-- +goose Up
CREATE TABLE tokens (
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

-- +goose Down
DROP TABLE tokens;
