-- warren scheduler schema, version 10 (8 and 9 are the volumes' and the
-- secrets').
--
-- Public templates: the name a team's snapshot or built record is
-- published under (E2B's `public`, PATCH /templates/{id}); NULL when it is
-- not public. One record per public name, across every team: the unique
-- index is the fence two teams publishing one name at once meet.
ALTER TABLE template_records ADD COLUMN public_name TEXT;
CREATE UNIQUE INDEX template_records_public_name ON template_records (public_name);

-- Ended sandboxes' logs (E2B's GET /sandboxes/{id}/logs once the sandbox
-- is gone): what the DELETE report that removed the binding carried,
-- written in that transaction under the binding's team, kept until
-- `expires_at_ms` (the scheduler's --sandbox-log-retention after the end)
-- and within the team's --sandbox-log-team-bytes (the oldest ended
-- sandboxes' logs go first). A running sandbox's logs are its node's.
CREATE TABLE sandbox_logs (
    sandbox_id    TEXT NOT NULL,
    seq           BIGINT NOT NULL,
    team_id       TEXT NOT NULL,
    at_ms         BIGINT NOT NULL,
    level         TEXT NOT NULL,
    logger        TEXT NOT NULL,
    message       TEXT NOT NULL,
    -- JSON object of string values.
    fields        TEXT NOT NULL,
    -- What the line costs its team: its text and fields, plus 64.
    bytes         BIGINT NOT NULL,
    ended_at_ms   BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL,
    PRIMARY KEY (sandbox_id, seq)
);
CREATE INDEX sandbox_logs_team ON sandbox_logs (team_id, ended_at_ms);
CREATE INDEX sandbox_logs_expiry ON sandbox_logs (expires_at_ms);
