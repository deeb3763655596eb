//! Where a gateway keeps template and snapshot records (docs/blobs.md).
//!
//! - [`Records::Local`]: files in `--template-dir` (`warren_template::Store`),
//!   shared with the machine's nodes: a one-machine install, `warren dev`.
//! - [`Records::Scheduler`] (`--blob-store` set): the scheduler's store,
//!   through the records RPCs (`records.proto`), so every gateway reads
//!   and writes the same records and a restarted one loses nothing; the
//!   layers are blobs of the blob store, which gives their sizes (what a
//!   team's `--snapshot-team-bytes` counts). Every write is conditional on
//!   the version read, and the bounds travel with it: the store decides a
//!   race between two gateways and holds the bounds across all of them.
//!
//! Records cross the wire as `warren_template::Template` everywhere else
//! (the node control API, the store's files); [`to_record`] and
//! [`from_record`] convert (`warren_proto::records`, which nodes use too).

use std::path::PathBuf;
use std::sync::Arc;

pub use warren_proto::records::{from_record, kind_of, to_record};

/// See the module doc.
pub enum Records {
    Local(PathBuf),
    Scheduler(Arc<warren_blob::BlobStore>),
}
