//! [`super`]'s unit tests: paths, round trips, and symlinks and FIFOs a
//! sandbox could plant.
#![allow(clippy::unwrap_used)]

use super::*;

fn root(dir: &std::path::Path) -> OwnedFd {
    rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap()
}

fn p(s: &str) -> VPath {
    VPath::parse(s).unwrap()
}

#[test]
fn paths_never_climb() {
    assert_eq!(p("/a//b/./c/").display(), "/a/b/c");
    assert!(p("/").is_root() && p("").is_root());
    assert!(VPath::parse("/a/../b").is_err());
    assert!(VPath::parse("..").is_err());
    assert!(VPath::parse("a\0b").is_err());
}

#[test]
fn files_and_directories_round_trip() {
    let t = tempfile::tempdir().unwrap();
    let r = root(t.path());
    let me = rustix::process::getuid().as_raw();
    let owner = Owner {
        uid: me,
        gid: rustix::process::getgid().as_raw(),
        mode: 0o640,
    };
    let d = make_dir(&r, &p("/a/b/c"), owner, true).unwrap();
    assert_eq!(
        (d.kind, d.path.as_str(), d.name.as_str()),
        ("directory", "/a/b/c", "c")
    );
    assert!(matches!(
        make_dir(&r, &p("/a/b/c"), owner, false),
        Err(FsError::Conflict(_))
    ));
    assert!(matches!(
        make_dir(&r, &p("/x/y"), owner, false),
        Err(FsError::NotFound(_))
    ));
    let mut up = start_upload(&r, &p("/a/b/c/f.txt"), owner).unwrap();
    up.write(b"hello").unwrap();
    let e = up.finish().unwrap();
    assert_eq!((e.kind, e.size, e.mode), ("file", 5, 0o640));
    let (mut f, size) = open_file(&r, &p("a/b/c/f.txt")).unwrap();
    let mut s = String::new();
    std::io::Read::read_to_string(&mut f, &mut s).unwrap();
    assert_eq!((s.as_str(), size), ("hello", 5));
    // A cut upload leaves nothing behind.
    let mut up = start_upload(&r, &p("/a/g.txt"), owner).unwrap();
    up.write(b"partial").unwrap();
    drop(up);
    assert_eq!(list(&r, &p("/a"), 1).unwrap().len(), 1);
    let all = list(&r, &p("/"), 10).unwrap();
    let paths: Vec<&str> = all.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["/a", "/a/b", "/a/b/c", "/a/b/c/f.txt"]);
    let u = update(&r, &p("/a/b/c/f.txt"), None, None, Some(0o600)).unwrap();
    assert_eq!(u.mode, 0o600);
    remove(&r, &p("/a")).unwrap();
    assert!(matches!(stat(&r, &p("/a")), Err(FsError::NotFound(_))));
    assert!(remove(&r, &p("/")).is_err());
}

#[test]
fn symlinks_never_lead_out() {
    let t = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), b"host").unwrap();
    let vol = t.path().join("vol");
    std::fs::create_dir(&vol).unwrap();
    std::os::unix::fs::symlink(outside.path(), vol.join("out")).unwrap();
    std::os::unix::fs::symlink("../..", vol.join("up")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), vol.join("s")).unwrap();
    std::fs::write(vol.join("in.txt"), b"inside").unwrap();
    std::os::unix::fs::symlink("in.txt", vol.join("ok")).unwrap();
    let r = root(&vol);
    let owner = Owner::new(
        Some(rustix::process::getuid().as_raw()),
        Some(0),
        None,
        0o644,
    )
    .unwrap();
    for path in ["/out/secret", "/up/etc/passwd", "/s"] {
        assert!(
            matches!(open_file(&r, &p(path)), Err(FsError::BadRequest(_))),
            "{path}"
        );
    }
    assert!(matches!(
        start_upload(&r, &p("/out/planted"), owner),
        Err(FsError::BadRequest(_))
    ));
    assert!(matches!(
        make_dir(&r, &p("/out/d"), owner, true),
        Err(FsError::BadRequest(_))
    ));
    // A symlink is listed and removed as itself.
    let s = stat(&r, &p("/s")).unwrap();
    assert_eq!(s.kind, "symlink");
    assert!(s.target.unwrap().ends_with("secret"));
    remove(&r, &p("/out")).unwrap();
    assert!(outside.path().join("secret").exists());
    // Inside the volume a symlink is followed.
    let (mut f, _) = open_file(&r, &p("/ok")).unwrap();
    let mut s = String::new();
    std::io::Read::read_to_string(&mut f, &mut s).unwrap();
    assert_eq!(s, "inside");
    // Mode changes on a symlink are refused; nothing outside changes.
    assert!(update(&r, &p("/s"), None, None, Some(0o777)).is_err());
    assert_eq!(
        std::fs::read(outside.path().join("secret")).unwrap(),
        b"host"
    );
}

#[test]
fn a_fifo_cannot_hold_a_reader() {
    let t = tempfile::tempdir().unwrap();
    nix::unistd::mkfifo(
        &t.path().join("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let r = root(t.path());
    assert!(matches!(
        open_file(&r, &p("/pipe")),
        Err(FsError::BadRequest(_))
    ));
    assert_eq!(stat(&r, &p("/pipe")).unwrap().kind, "unknown");
}
