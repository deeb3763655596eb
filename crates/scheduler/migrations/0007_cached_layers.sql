-- warren scheduler schema, version 7.
--
-- The layers each node holds unpacked in its cache (a node with
-- --blob-store reports them in every heartbeat): space-separated
-- `sha256-<hex>` digests, at most 1000. Placement prefers, among nodes
-- about as loaded, one that holds the template's top layer.
ALTER TABLE nodes ADD COLUMN cached_layers TEXT NOT NULL DEFAULT '';
