-- warren scheduler schema, version 9: team secrets (E2B's /secrets) and
-- each sandbox's egress CA.
--
-- (Version 8 is another change's; versions apply in order of number, each
-- once, whichever lands first.)

-- The sandbox's egress CA (certificate and private key, PEM), made at
-- Place, sealed under the store key like `access_token` (store/seal.rs);
-- '' for a binding placed before this version.
ALTER TABLE bindings ADD COLUMN egress_ca TEXT NOT NULL DEFAULT '';

-- A team's secrets. The value is write-only: sealed under the secrets key
-- (--secrets-key-file), bound to the team and the secret's id, and only
-- ever opened for a node's egress proxy resolving a placeholder of a
-- sandbox of that team. Only the current version's value is kept: nothing
-- can name an earlier one.
CREATE TABLE secrets (
    -- `sec_` and 24 random letters and digits.
    secret_id     TEXT PRIMARY KEY,
    team_id       TEXT NOT NULL,
    -- Lower-cased, unique within the team.
    name          TEXT NOT NULL,
    -- The current version: 1 at create, one more at every update.
    version       BIGINT NOT NULL,
    -- `sealed:v1:<key id>:...` under the secrets key.
    value         TEXT NOT NULL,
    -- JSON object of strings (E2B's bounds: 32 entries, 8 KiB).
    metadata      TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL
);
CREATE UNIQUE INDEX secrets_team_name ON secrets (team_id, name);
