-- warren scheduler schema, version 4.
--
-- Each node's number of bindings, kept in the same transaction as every
-- binding insert, move and removal, so that placing a sandbox reads it
-- instead of counting every binding of every live node (a scan of the
-- whole table per create: 2 creates/s with a million sandboxes).
ALTER TABLE nodes ADD COLUMN sandboxes BIGINT NOT NULL DEFAULT 0;
UPDATE nodes SET sandboxes = (SELECT COUNT(*) FROM bindings b WHERE b.node_id = nodes.node_id);
