//! The registry's side of each sandbox's log ([`crate::logs`]): envd's
//! entries read on demand, the node's lifecycle entries, the log handed on
//! when the sandbox ends (with its DELETE event and in the delete's
//! answer).

use super::*;
use warren_core::node_api::SandboxLogEntry;

/// How long reading envd's log may take when someone asks for it.
const READ_TIME: Duration = Duration::from_secs(2);
/// How long the last read may hold up a delete or a pause.
const LAST_READ_TIME: Duration = Duration::from_secs(1);

impl Registry {
    /// envd's access token, when the node knows it (from the create; a
    /// sandbox adopted after a node restart has none here, and its log
    /// keeps only the node's entries from then on).
    fn envd_token(sb: &Sandbox) -> Option<String> {
        sb.boot.as_ref().and_then(|b| b.0.access_token.clone())
    }

    /// Reads envd's new entries into `sb`'s log, unless it is paused
    /// (envd is frozen or gone then).
    pub(super) async fn read_envd_log(&self, sb: &Sandbox, within: Duration) {
        if sb.is_paused() {
            return;
        }
        let token = Self::envd_token(sb);
        self.logs
            .refresh(
                &sb.info.sandbox_id,
                &sb.paths.envd_sock,
                token.as_deref(),
                within,
            )
            .await;
    }

    /// A lifecycle entry of the node's in `id`'s log.
    pub(super) fn log_lifecycle(
        &self,
        id: &str,
        message: &str,
        fields: impl IntoIterator<Item = (&'static str, String)>,
    ) {
        self.logs.node(id, "info", message, fields);
    }

    /// The sandbox's log as it is now (envd's latest entries read first),
    /// for `GET .../{id}/logs`.
    pub async fn logs(&self, id: &str, generation: u64) -> Result<Vec<SandboxLogEntry>, NodeError> {
        let sb = self
            .get(id, generation)
            .ok_or_else(|| self.not_hosted(id, Some(generation)))?;
        self.read_envd_log(&sb, READ_TIME).await;
        Ok(self.logs.entries(id))
    }

    /// The last of envd's entries and the node's "killed" entry; the log
    /// is handed on (and forgotten here) by [`Registry::end_log`].
    pub(super) async fn last_log(&self, sb: &Sandbox, reason: &str) {
        self.read_envd_log(sb, LAST_READ_TIME).await;
        self.log_lifecycle(
            &sb.info.sandbox_id,
            "Sandbox killed",
            [
                ("reason", reason.to_string()),
                ("generation", sb.info.generation.to_string()),
            ],
        );
    }

    /// Forgets `id`'s log, answering it: what its DELETE event carries.
    pub(super) fn end_log(&self, id: &str) -> Vec<SandboxLogEntry> {
        self.logs.take(id)
    }
}
