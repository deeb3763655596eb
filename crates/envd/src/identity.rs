//! The sandbox's name, given with its settings (`hostname` on stdin): the
//! node names every isolated sandbox after its id, and hands it over with
//! the rest of the create (its token, its environment) rather than at
//! launch, so a sandbox started ahead for a warm pool gets its name, like
//! everything else of its create, only when a create takes it.
//!
//! envd is the sandbox's root here (of its user namespace, which owns its
//! uts namespace): it sets the kernel's hostname and writes `/etc/hostname`
//! and `/etc/hosts` under its root, replacing what the template has, as
//! before anything in the sandbox runs.

use std::path::Path;

/// The longest name the kernel takes.
const MAX_LEN: usize = 64;

/// Names the sandbox `name` (see the module doc). `root` is envd's `--root`.
pub fn apply(root: &Path, name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > MAX_LEN
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(format!("{name:?} is not a hostname envd sets"));
    }
    nix::unistd::sethostname(name).map_err(|e| format!("sethostname: {e}"))?;
    let etc = root.join("etc");
    let _ = std::fs::create_dir_all(&etc);
    for (file, text) in [
        ("hostname", format!("{name}\n")),
        (
            "hosts",
            format!("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n127.0.1.1\t{name}\n"),
        ),
    ] {
        let path = etc.join(file);
        // A link the template put there is replaced, never followed.
        let _ = std::fs::remove_file(&path);
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_a_plain_name_is_taken() {
        let dir = tempfile::tempdir().expect("tempdir");
        for bad in ["", "a/b", "A", "a b", &"x".repeat(65)] {
            assert!(super::apply(dir.path(), bad).is_err(), "{bad:?}");
        }
    }
}
