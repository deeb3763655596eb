-- warren scheduler schema, version 2.
--
-- When a node's roster (same incarnation) first lacked a RUNNING or PAUSED
-- binding; NULL while the node lists it. A binding missing for longer than
-- --creating-timeout is removed: its sandbox died on the node without a DELETE.
ALTER TABLE bindings ADD COLUMN missing_since_ms BIGINT;
