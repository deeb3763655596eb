-- warren scheduler schema, version 3.
--
-- When a gateway last reported the node unreachable (NULL: not since its
-- last heartbeat). Nothing is placed on such a node.
ALTER TABLE nodes ADD COLUMN unreachable_since_ms BIGINT;

-- Each team's create-rate token bucket (--quota-creates-per-minute): the
-- tokens left at `at_ms`, refilled continuously up to one minute's worth.
CREATE TABLE team_create_budget (
    team_id TEXT PRIMARY KEY,
    tokens DOUBLE PRECISION NOT NULL,
    at_ms BIGINT NOT NULL
);
