//! File metadata as E2B's envd (>= 0.6.2) keeps it: user-defined key/value
//! pairs stored as extended attributes under `user.e2b.` on the file
//! itself, so they follow the file through renames and are visible to
//! tools in the sandbox (`getfattr -d`).
//!
//! - An upload sets them from its `X-Metadata-<key>: <value>` headers (the
//!   key lower-cased, the first of repeated headers wins) and replaces what
//!   the file had: keys it does not name are removed, so an upload without
//!   any clears them. Both are checked before anything is written.
//! - `Stat`, `ListDir`, `Move`, `MakeDir` and watch events report them in
//!   `EntryInfo.metadata` (the prefix stripped), whoever set them.
//!
//! Keys and values are printable US-ASCII; a key is at most
//! [`MAX_KEY_BYTES`] (the kernel's 255-byte xattr name limit, minus the
//! prefix) and all of a file's metadata at most [`MAX_TOTAL_BYTES`] (what
//! one ext4 inode block holds).

use std::collections::BTreeMap;
use std::io;
use std::os::fd::AsFd;
use std::path::Path;

/// The xattr namespace of E2B's file metadata.
pub const PREFIX: &str = "user.e2b.";

/// The request header prefix an upload names metadata with.
pub const HEADER_PREFIX: &str = "x-metadata-";

/// Longest key: the kernel limits a whole xattr name to 255 bytes.
pub const MAX_KEY_BYTES: usize = 255 - PREFIX.len();

/// Most metadata one file holds: the names (prefix included) and values.
pub const MAX_TOTAL_BYTES: usize = 4096;

/// Metadata an upload names, from its `X-Metadata-*` headers; `Err` names
/// the first problem (a 400 for the client).
pub fn from_headers(headers: &http::HeaderMap) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (name, value) in headers {
        // `HeaderName`s are lower-case already.
        let Some(key) = name.as_str().strip_prefix(HEADER_PREFIX) else {
            continue;
        };
        if out.contains_key(key) {
            continue;
        }
        let value = value.to_str().map_err(|_| {
            format!("metadata value for key {key:?} must be printable US-ASCII (bytes 0x20-0x7E)")
        })?;
        out.insert(key.to_string(), value.to_string());
    }
    validate(&out)?;
    Ok(out)
}

/// Checks metadata before anything is written.
pub fn validate(metadata: &BTreeMap<String, String>) -> Result<(), String> {
    let mut total = 0;
    for (key, value) in metadata {
        if key.is_empty() {
            return Err("a metadata key must not be empty (X-Metadata-<key>)".into());
        }
        if key.len() > MAX_KEY_BYTES {
            return Err(format!(
                "metadata key {key:?} is {} bytes; the limit is {MAX_KEY_BYTES}",
                key.len()
            ));
        }
        printable("key", key, key)?;
        printable("value for key", key, value)?;
        total += PREFIX.len() + key.len() + value.len();
    }
    if total > MAX_TOTAL_BYTES {
        return Err(format!(
            "metadata of {total} bytes (keys with their `{PREFIX}` prefix, and values) is over \
             the limit of {MAX_TOTAL_BYTES} bytes per file"
        ));
    }
    Ok(())
}

fn printable(what: &str, key: &str, s: &str) -> Result<(), String> {
    match s.bytes().position(|b| !(0x20..=0x7e).contains(&b)) {
        None => Ok(()),
        Some(at) => Err(format!(
            "metadata {what} {key:?} has a byte that is not printable US-ASCII at offset {at}"
        )),
    }
}

/// Whether an error says the file system keeps no user xattrs (`/proc`,
/// some FUSE mounts): such files simply have no metadata.
fn unsupported(e: &rustix::io::Errno) -> bool {
    *e == rustix::io::Errno::OPNOTSUPP || *e == rustix::io::Errno::NOTSUP
}

/// The file's metadata (following symlinks), without the prefix. A file
/// system without xattrs, or a value that is not text, reads as none.
pub fn read(path: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(names) = list(|buf| rustix::fs::listxattr(path, buf)) else {
        return out;
    };
    for name in names {
        let Some(key) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let mut value = vec![0u8; 4096];
        let got = match rustix::fs::getxattr(path, name.as_str(), &mut value[..]) {
            Ok(n) => Some(n),
            Err(rustix::io::Errno::RANGE) => {
                value.resize(64 * 1024, 0);
                rustix::fs::getxattr(path, name.as_str(), &mut value[..]).ok()
            }
            Err(_) => None,
        };
        if let Some(n) = got {
            value.truncate(n);
            if let Ok(text) = String::from_utf8(value) {
                out.insert(key.to_string(), text);
            }
        }
    }
    out
}

/// The xattr names `call` lists (`listxattr`'s NUL-separated buffer).
fn list(call: impl Fn(&mut [u8]) -> rustix::io::Result<usize>) -> rustix::io::Result<Vec<String>> {
    // Most files have none: one syscall with a small buffer says so.
    let mut buf = vec![0u8; 1024];
    let n = match call(&mut buf) {
        Ok(n) => n,
        Err(rustix::io::Errno::RANGE) => {
            buf.resize(64 * 1024, 0);
            call(&mut buf)?
        }
        Err(e) => return Err(e),
    };
    Ok(buf[..n]
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .filter_map(|s| std::str::from_utf8(s).ok().map(str::to_string))
        .collect())
}

/// Makes `file`'s metadata exactly `metadata` (validated): removes the
/// `user.e2b.*` attributes it does not name, sets the ones it does. On a
/// file system without xattrs, clearing is a no-op and setting fails.
pub fn replace(file: impl AsFd, metadata: &BTreeMap<String, String>) -> io::Result<()> {
    let fd = file.as_fd();
    let existing = match list(|buf| rustix::fs::flistxattr(fd, buf)) {
        Ok(names) => names,
        Err(e) if unsupported(&e) && metadata.is_empty() => return Ok(()),
        Err(e) if unsupported(&e) => return Err(not_supported()),
        Err(e) => return Err(e.into()),
    };
    for name in existing {
        let Some(key) = name.strip_prefix(PREFIX) else {
            continue;
        };
        if !metadata.contains_key(key) {
            match rustix::fs::fremovexattr(fd, name.as_str()) {
                Ok(()) | Err(rustix::io::Errno::NODATA) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    for (key, value) in metadata {
        rustix::fs::fsetxattr(
            fd,
            format!("{PREFIX}{key}").as_str(),
            value.as_bytes(),
            rustix::fs::XattrFlags::empty(),
        )
        .map_err(|e| {
            if unsupported(&e) {
                not_supported()
            } else {
                io::Error::from(e)
            }
        })?;
    }
    Ok(())
}

fn not_supported() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "this file system does not keep extended attributes, so the file cannot carry metadata",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                http::HeaderValue::from_str(v).expect("value"),
            );
        }
        h
    }

    #[test]
    fn keys_come_lower_cased_from_headers_and_the_first_value_wins() {
        let m = from_headers(&headers(&[
            ("X-Metadata-Author", "mish"),
            ("x-metadata-author", "second"),
            ("X-Metadata-Purpose", "upload"),
            ("Content-Type", "text/plain"),
        ]))
        .expect("valid");
        assert_eq!(
            m.into_iter().collect::<Vec<_>>(),
            vec![
                ("author".to_string(), "mish".to_string()),
                ("purpose".to_string(), "upload".to_string())
            ]
        );
    }

    #[test]
    fn bad_metadata_is_refused_with_the_reason() {
        assert!(from_headers(&headers(&[("X-Metadata-", "v")]))
            .unwrap_err()
            .contains("empty"));
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        assert!(validate(&BTreeMap::from([(long, "v".into())]))
            .unwrap_err()
            .contains("limit"));
        assert!(
            validate(&BTreeMap::from([("k".into(), "tab\there".into())]))
                .unwrap_err()
                .contains("printable")
        );
        let big: BTreeMap<String, String> = (0..40)
            .map(|i| (format!("k{i}"), "v".repeat(100)))
            .collect();
        assert!(validate(&big).unwrap_err().contains("4096"));
    }

    #[test]
    fn replace_sets_removes_and_reads_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let file = std::fs::File::create(&path).expect("create");
        let first = BTreeMap::from([("a".to_string(), "1".to_string()), ("b".into(), "2".into())]);
        replace(&file, &first).expect("set");
        assert_eq!(read(&path), first);
        let second = BTreeMap::from([("b".to_string(), "3".to_string())]);
        replace(&file, &second).expect("replace");
        assert_eq!(read(&path), second);
        replace(&file, &BTreeMap::new()).expect("clear");
        assert!(read(&path).is_empty());
    }
}
