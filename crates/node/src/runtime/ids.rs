//! Host id ranges: each live isolated sandbox gets its own range of
//! [`IDS_PER_SANDBOX`] host uids and gids, so no two sandboxes share a host
//! identity (kernel per-uid state — keyrings, inotify instances, `RLIMIT_NPROC`,
//! `/proc` access — is never shared) and none is a real account.
//!
//! Range `k` is `base + k * 65536 .. base + (k + 1) * 65536`. A range is
//! taken by holding an exclusive `flock` on `<lock_dir>/<k>.lock`; the lock
//! dir is host-wide (default `/run/warren/ids`), so several nodes on one
//! machine (`warren dev` runs two) never hand out the same range, and a node
//! that dies releases its ranges with its file descriptors.

use super::launch::IDS_PER_SANDBOX;
use nix::fcntl::{Flock, FlockArg};
use std::fs::File;
use std::path::{Path, PathBuf};

/// Where range locks live unless configured otherwise.
pub const DEFAULT_LOCK_DIR: &str = "/run/warren/ids";

/// The allocator (see the module doc).
#[derive(Debug)]
pub struct IdRanges {
    base: u32,
    slots: u32,
    lock_dir: PathBuf,
    /// Where the next search for a free range starts: past the last one
    /// taken, so a create tries one lock, not one per range taken before
    /// it (which made each create's cost grow with the sandboxes hosted),
    /// and a range just released is not handed out again at once.
    next: std::sync::atomic::AtomicU32,
}

/// One range, held until dropped.
#[derive(Debug)]
pub struct IdRange {
    pub slot: u32,
    pub base: u32,
    _lock: Flock<File>,
}

/// How many ranges fit between `base` and the top of the id space (at most
/// 32768: a few per node on a machine is the most ever used).
pub fn ranges_above(base: u32) -> u32 {
    let room = u64::from(u32::MAX - 1).saturating_sub(u64::from(base)) / u64::from(IDS_PER_SANDBOX);
    room.min(32768) as u32
}

impl IdRanges {
    /// Checks that `base..` holds `slots` ranges within the id space and
    /// overlaps no account in `/etc/passwd` or group in `/etc/group`.
    pub fn new(base: u32, slots: u32, lock_dir: &Path) -> Result<IdRanges, String> {
        let end = u64::from(base) + u64::from(slots) * u64::from(IDS_PER_SANDBOX);
        if base < 65536 || end > u64::from(u32::MAX - 1) {
            return Err(format!(
                "--sandbox-id-base {base} with {slots} ranges of {IDS_PER_SANDBOX} ids does not fit \
                 between 65536 and 2^32-2"
            ));
        }
        for (file, what) in [("/etc/passwd", "user"), ("/etc/group", "group")] {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            for line in text.lines() {
                let mut f = line.split(':');
                let (name, id) = (f.next(), f.nth(1));
                if let (Some(name), Some(Ok(id))) = (name, id.map(str::parse::<u64>)) {
                    if id >= u64::from(base) && id < end {
                        return Err(format!(
                            "host {what} {name:?} ({id}) lies in the sandbox id ranges \
                             {base}..{end}; choose another --sandbox-id-base"
                        ));
                    }
                }
            }
        }
        std::fs::create_dir_all(lock_dir)
            .map_err(|e| format!("cannot create {}: {e}", lock_dir.display()))?;
        Ok(IdRanges {
            base,
            slots,
            lock_dir: lock_dir.to_path_buf(),
            next: std::sync::atomic::AtomicU32::new(0),
        })
    }

    /// Every host id any range can hand out: (first, last).
    pub fn span(&self) -> (u32, u32) {
        let end = u64::from(self.base) + u64::from(self.slots) * u64::from(IDS_PER_SANDBOX) - 1;
        // `new` checked that the ranges end below 2^32 - 2.
        (self.base, u32::try_from(end).unwrap_or(u32::MAX - 2))
    }

    /// Whether range `slot` is free now (nobody holds its lock).
    pub fn is_free(&self, slot: u32) -> bool {
        let path = self.lock_dir.join(format!("{slot}.lock"));
        let Ok(file) = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
        else {
            return false;
        };
        Flock::lock(file, FlockArg::LockExclusiveNonblock).is_ok()
    }

    /// Takes a free range (`prefer` first, e.g. the one an adopted sandbox had).
    pub fn take(&self, prefer: Option<u32>) -> Result<IdRange, String> {
        use std::sync::atomic::Ordering;
        let start = self.next.load(Ordering::Relaxed) % self.slots.max(1);
        let order = prefer
            .into_iter()
            .filter(|p| *p < self.slots)
            .chain(start..self.slots)
            .chain(0..start);
        for slot in order {
            let path = self.lock_dir.join(format!("{slot}.lock"));
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
            if let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                self.next.store(slot + 1, Ordering::Relaxed);
                return Ok(IdRange {
                    slot,
                    base: self.base + slot * IDS_PER_SANDBOX,
                    _lock: lock,
                });
            }
        }
        Err(format!(
            "all {} sandbox id ranges under {} are taken",
            self.slots,
            self.lock_dir.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_exclusive_until_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ids = IdRanges::new(3_000_000_000, 4, dir.path()).expect("ranges");
        let a = ids.take(None).expect("a");
        let b = ids.take(None).expect("b");
        assert_ne!(a.base, b.base);
        assert_eq!(a.base % IDS_PER_SANDBOX, 3_000_000_000 % IDS_PER_SANDBOX);
        let slot = a.slot;
        assert_eq!(
            ids.span(),
            (3_000_000_000, 3_000_000_000 + 4 * IDS_PER_SANDBOX - 1)
        );
        assert!(a.base >= ids.span().0 && b.base + IDS_PER_SANDBOX - 1 <= ids.span().1);
        drop(a);
        assert_eq!(ids.take(Some(slot)).expect("again").slot, slot);
    }

    #[test]
    fn the_search_goes_on_past_the_last_range_taken_and_wraps() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ids = IdRanges::new(3_000_000_000, 3, dir.path()).expect("ranges");
        let a = ids.take(None).expect("a");
        let b = ids.take(None).expect("b");
        drop(a);
        // Not the one just released while another is free.
        let c = ids.take(None).expect("c");
        assert_eq!((b.slot, c.slot), (1, 2));
        // Then, wrapped around, the released one.
        let d = ids.take(None).expect("d");
        assert_eq!(d.slot, 0);
        assert!(ids.take(None).is_err(), "all three are held");
    }

    #[test]
    fn ranges_must_fit_and_avoid_accounts() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(IdRanges::new(0, 4, dir.path()).is_err(), "root's ids");
        assert!(IdRanges::new(u32::MAX - 10, 1, dir.path()).is_err());
    }
}
