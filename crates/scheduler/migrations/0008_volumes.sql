-- warren scheduler schema, version 8: E2B's persistent volumes.
--
-- A volume is a directory tree in a node's volume store (`--volume-dir`):
-- local to one node (`node_id` set: sandboxes that mount it are placed
-- there) or on an operator's shared mount (`node_id` ''), which every node
-- declaring it (`--volume-shared`) reaches. Its bearer token is sealed
-- like a sandbox's access token (`store/seal.rs`). Every change is one
-- conditional statement under the write lock (`store/sqlstore/volumes.rs`).

CREATE TABLE volumes (
    volume_id     TEXT PRIMARY KEY,
    team_id       TEXT NOT NULL,
    name          TEXT NOT NULL,
    -- The volume's bearer token, sealed (column `volume_token`).
    token         TEXT NOT NULL,
    -- The node whose store holds it; '' when the store is shared.
    node_id       TEXT NOT NULL,
    -- Its size limit in bytes when it was made (the node's
    -- --volume-max-bytes); 0: none. Counts against the team's bytes.
    max_bytes     BIGINT NOT NULL,
    -- 'ready' | 'deleting' (no new mount; its data is being removed).
    state         TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    version       BIGINT NOT NULL
);
CREATE UNIQUE INDEX volumes_team_name ON volumes (team_id, name);

-- Which sandbox mounts which volume where, written with the sandbox's
-- binding (Place; a fork copies its parent's). A row whose binding is gone
-- no longer counts (every read joins `bindings`); the sweep removes it.
CREATE TABLE volume_mounts (
    sandbox_id TEXT NOT NULL,
    path       TEXT NOT NULL,
    volume_id  TEXT NOT NULL,
    PRIMARY KEY (sandbox_id, path)
);
CREATE INDEX volume_mounts_volume ON volume_mounts (volume_id);

-- What each node's volume store is: '' none, 'local' or 'shared'; and the
-- size limit it gives each new volume (0: none).
ALTER TABLE nodes ADD COLUMN volume_store TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN volume_max_bytes BIGINT NOT NULL DEFAULT 0;
