//! Replays every committed corpus and regression input through its fuzz
//! target as an ordinary test (CI runs it: `cargo test -p warren-fuzz`).
//! A target fails by panicking; the input that did is named.

use std::path::Path;

fn replay(dir: &Path, run: fn(&[u8])) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut files: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    files.sort();
    for f in &files {
        let data = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let outcome = std::panic::catch_unwind(|| run(&data));
        assert!(outcome.is_ok(), "{} fails its target", f.display());
    }
    files.len()
}

#[test]
fn corpora_and_regressions_pass() {
    let base = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut total = 0;
    for (name, run) in warren_fuzz::TARGETS {
        let corpus = replay(&base.join("corpus").join(name), *run);
        let regressions = replay(&base.join("regressions").join(name), *run);
        assert!(
            corpus > 0,
            "fuzz/corpus/{name} is empty: run scripts/fuzz {name} and commit its minimised corpus"
        );
        println!("{name}: {corpus} corpus inputs, {regressions} regressions");
        total += corpus + regressions;
    }
    println!("{total} inputs replayed");
}

#[test]
fn every_target_has_a_binary() {
    let base = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (name, _) in warren_fuzz::TARGETS {
        assert!(
            base.join("fuzz_targets")
                .join(format!("{name}.rs"))
                .is_file(),
            "fuzz_targets/{name}.rs is missing"
        );
    }
}
