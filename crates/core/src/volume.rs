//! Volumes (E2B's persistent volumes): their ids, names and the paths a
//! sandbox mounts them at, checked the same way by the gateway, the
//! scheduler and the node (docs/sandboxes.md, "Volumes").
//!
//! A volume id names a directory (or an image file) in a node's volume
//! store, so it is kept to `[a-z0-9]`; a mount path is tenant input that
//! the sandbox's first process makes a directory of, so it is normalized
//! here once and anything odd is refused with a message naming it.

/// Length of a generated volume id.
pub const VOLUME_ID_LEN: usize = 24;
/// Longest volume id accepted.
pub const MAX_VOLUME_ID_LEN: usize = 64;
/// Longest volume name (E2B's `^[a-zA-Z0-9_-]+$`).
pub const MAX_NAME_LEN: usize = 64;
/// Most volumes one sandbox mounts.
pub const MAX_MOUNTS: usize = 16;
/// Longest mount path, in bytes.
pub const MAX_MOUNT_PATH_LEN: usize = 256;
/// Most components of a mount path.
pub const MAX_MOUNT_DEPTH: usize = 16;

/// Where no volume may be mounted: the sandbox's own kernel views, its
/// devices, and the directory envd's binary is bound into.
const RESERVED: &[&str] = &["/proc", "/sys", "/dev", "/opt/warren"];

/// A new random volume id (`[a-z0-9]`, [`VOLUME_ID_LEN`] characters).
pub fn new_volume_id() -> String {
    crate::id::random_token(VOLUME_ID_LEN)
}

/// A new volume bearer token (`vt_` and 40 random characters: 206 bits).
pub fn new_token() -> String {
    format!("vt_{}", crate::id::random_token(40))
}

/// Checks a volume id: 1..=64 characters of `[a-z0-9]`.
pub fn validate_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("volume id is empty".into());
    }
    if id.len() > MAX_VOLUME_ID_LEN {
        return Err(format!(
            "volume id is {} characters long; the limit is {MAX_VOLUME_ID_LEN}",
            id.len()
        ));
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return Err(format!(
            "volume id {:?} has a character outside [a-z0-9]",
            id.chars().take(80).collect::<String>()
        ));
    }
    Ok(())
}

/// Checks a volume name: 1..=64 characters of `[a-zA-Z0-9_-]` (E2B's
/// `NewVolume.name` pattern).
pub fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("volume name is empty".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "volume name is {} characters long; the limit is {MAX_NAME_LEN}",
            name.len()
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(format!(
            "volume name {:?} has a character outside [a-zA-Z0-9_-]",
            name.chars().take(80).collect::<String>()
        ));
    }
    Ok(())
}

/// A mount path, normalized: absolute, components of `[A-Za-z0-9._-]`
/// (never `.` or `..`), `//` and a trailing `/` folded, not `/` itself nor
/// under `/proc`, `/sys`, `/dev` or `/opt/warren`.
pub fn mount_path(path: &str) -> Result<String, String> {
    let bad = |why: &str| Err(format!("volume mount path {path:?} {why}"));
    if !path.starts_with('/') {
        return bad("must be absolute (start with /)");
    }
    if path.len() > MAX_MOUNT_PATH_LEN {
        return bad(&format!("is longer than {MAX_MOUNT_PATH_LEN} bytes"));
    }
    let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    if parts.is_empty() {
        return bad("is the sandbox's root; mount a volume under it, e.g. /mnt/data");
    }
    if parts.len() > MAX_MOUNT_DEPTH {
        return bad(&format!("has more than {MAX_MOUNT_DEPTH} components"));
    }
    for c in &parts {
        if *c == "." || *c == ".." {
            return bad("may not contain . or .. components");
        }
        if !c
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
        {
            return bad("may only contain letters, digits, '.', '_' and '-' between slashes");
        }
    }
    let norm = format!("/{}", parts.join("/"));
    for r in RESERVED {
        if norm == *r || norm.starts_with(&format!("{r}/")) {
            return bad(&format!("is under {r}, which the sandbox needs for itself"));
        }
    }
    Ok(norm)
}

/// Checks a sandbox's mount paths together: each valid, none twice, none
/// inside another (a volume mounted inside another volume would hide part
/// of it, or be hidden). Returns them normalized, in the order given.
pub fn mount_paths<'a>(paths: impl IntoIterator<Item = &'a str>) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for p in paths {
        let p = mount_path(p)?;
        for q in &out {
            if *q == p {
                return Err(format!("two volumes are mounted at {p}"));
            }
            let (outer, inner) = if p.len() < q.len() { (&p, q) } else { (q, &p) };
            if inner.starts_with(&format!("{outer}/")) {
                return Err(format!(
                    "volume mount path {inner} is inside another volume's, {outer}"
                ));
            }
        }
        out.push(p);
    }
    if out.len() > MAX_MOUNTS {
        return Err(format!(
            "a sandbox mounts at most {MAX_MOUNTS} volumes; {} were asked for",
            out.len()
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names() {
        let id = new_volume_id();
        assert!(validate_id(&id).is_ok(), "{id}");
        assert_eq!(id.len(), VOLUME_ID_LEN);
        assert!(validate_id("").is_err());
        assert!(validate_id("../x").is_err());
        assert!(validate_id("ABC").is_err());
        assert!(validate_name("my-vol_1").is_ok());
        for bad in ["", "a b", "a/b", "é", &"x".repeat(65)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert!(new_token().starts_with("vt_"));
    }

    #[test]
    fn mount_paths_are_normalized_and_odd_ones_refused() {
        assert_eq!(mount_path("/mnt/data").unwrap(), "/mnt/data");
        assert_eq!(mount_path("//mnt///data/").unwrap(), "/mnt/data");
        assert_eq!(mount_path("/home/user/work").unwrap(), "/home/user/work");
        for bad in [
            "mnt/data",
            "/",
            "///",
            "/mnt/../etc",
            "/mnt/./x",
            "/proc",
            "/proc/self",
            "/dev/shm",
            "/sys",
            "/opt/warren/bin",
            "/mnt/da ta",
            "/mnt/data\0",
            "/mnt/$(x)",
        ] {
            assert!(mount_path(bad).is_err(), "{bad:?} should be refused");
        }
        // A name that only starts like a reserved one is fine.
        assert_eq!(mount_path("/devices").unwrap(), "/devices");
        assert!(mount_path(&format!("/{}", "a/".repeat(17))).is_err());
    }

    #[test]
    fn a_sandbox_mounts_distinct_paths_none_inside_another() {
        assert_eq!(
            mount_paths(["/mnt/a", "/mnt/b"]).unwrap(),
            vec!["/mnt/a", "/mnt/b"]
        );
        assert!(mount_paths(["/mnt/a", "/mnt/a/"]).is_err());
        assert!(mount_paths(["/mnt/a", "/mnt/a/b"]).is_err());
        assert!(mount_paths(["/mnt/a/b", "/mnt/a"]).is_err());
        assert!(mount_paths(["/mnt/a", "/mnt/ab"]).is_ok());
        let many: Vec<String> = (0..17).map(|i| format!("/v{i}")).collect();
        assert!(mount_paths(many.iter().map(String::as_str)).is_err());
    }
}
