//! What the blob store's tests share.
#![allow(dead_code)]

use sha2::Digest as _;
use std::io::Write;
use std::path::Path;
use warren_blob::Digest;

/// Writes `len` bytes of a pattern seeded by `seed` to `path`.
pub fn write_pattern(path: &Path, len: usize, seed: u8) {
    let mut f = std::fs::File::create(path).expect("create");
    let block: Vec<u8> = (0..65536u32)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect();
    let mut left = len;
    while left > 0 {
        let n = left.min(block.len());
        f.write_all(&block[..n]).expect("write");
        left -= n;
    }
}

/// A file of `len` bytes that is mostly a hole (quick to make and to
/// read), with a few distinct bytes at its start, middle and end.
pub fn write_sparse(path: &Path, len: u64) {
    use std::io::{Seek, SeekFrom};
    let mut f = std::fs::File::create(path).expect("create");
    f.set_len(len).expect("set_len");
    for at in [0, len / 2, len - 16] {
        f.seek(SeekFrom::Start(at)).expect("seek");
        f.write_all(&at.to_le_bytes()).expect("write");
    }
}

/// The digest of the file at `path`, computed independently.
pub fn digest_of(path: &Path) -> Digest {
    let bytes = std::fs::read(path).expect("read");
    Digest::from_sha256(sha2::Sha256::digest(&bytes).into())
}

/// Whether two files hold the same bytes (without loading both whole).
pub fn same_bytes(a: &Path, b: &Path) -> bool {
    digest_of(a) == digest_of(b)
}

/// The names in `dir` (to check that nothing temporary was left).
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}
