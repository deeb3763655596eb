-- warren scheduler schema, version 5.
--
-- Each sandbox's lifecycle (E2B's autoPause / autoResume), 0 or 1:
-- `auto_pause`: at its end the sandbox is paused (EXPIRING, then PAUSED
-- when its node reports the freeze) instead of killed; `auto_resume`: a
-- data-plane request resumes it when paused. Sandboxes from before were
-- created without either: killed at their end, resumed only explicitly.
ALTER TABLE bindings ADD COLUMN auto_pause BIGINT NOT NULL DEFAULT 0;
ALTER TABLE bindings ADD COLUMN auto_resume BIGINT NOT NULL DEFAULT 0;
