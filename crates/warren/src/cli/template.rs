//! `warren template build FILE | import TARBALL --name N | ls | push --to
//! URL [--import] | gc`: templates in a template store (`--template-dir`,
//! the directory every node and gateway of the machine reads), copying its
//! blobs to a blob store (`warren-blob`) and its records to the
//! scheduler's, through a gateway (docs/blobs.md), and collecting what no
//! record names (`warren_template::gc`; docs/sandboxes.md, "Collecting a
//! template store").

use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use warren_template::spec::Defaults;
use warren_template::{build, Spec, Store};

/// Where templates live unless `--template-dir` says otherwise.
pub const DEFAULT_TEMPLATE_DIR: &str = "/var/lib/warren/templates";

#[derive(Debug, Parser)]
#[command(
    name = "warren template",
    about = "Build, import and list sandbox templates"
)]
struct Cli {
    /// The template store.
    #[arg(long, global = true, env = "WARREN_TEMPLATE_DIR", default_value = DEFAULT_TEMPLATE_DIR)]
    template_dir: PathBuf,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Builds a template from a build file (TOML; see templates/base.toml)
    /// with mmdebstrap, from the Debian archive (or the one it names).
    Build {
        file: PathBuf,
        /// Rebuild even when a template by that name exists.
        #[arg(long)]
        force: bool,
    },
    /// Imports a root filesystem tarball (what `docker export` writes).
    Import {
        tarball: PathBuf,
        #[arg(long)]
        name: String,
        /// Who commands run as by default.
        #[arg(long, default_value = "root")]
        user: String,
        #[arg(long, default_value = "/")]
        workdir: String,
        #[arg(long, default_value_t = 2)]
        cpu_count: u32,
        #[arg(long, default_value_t = 512)]
        memory_mb: u64,
        #[arg(long, default_value_t = 2048)]
        disk_mb: u64,
    },
    /// Lists the templates in the store.
    Ls,
    /// Removes what no record names: blobs and unpacked trees unnamed for
    /// --grace that no sandbox of this host stacks, scratch older than
    /// --grace, and, given the teams that still exist, every other team's
    /// snapshots and templates. Prints what it removed (with --dry-run:
    /// what it would) and the store's size before and after.
    Gc {
        /// How long a blob or tree must have been unnamed (a record's end,
        /// a rebuild) before it goes: room for creates that resolved a
        /// record just before it went.
        #[arg(long, default_value = "1h", value_parser = warren_core::config::parse_duration)]
        grace: std::time::Duration,
        /// A team that still exists (repeat it); with any --keep-team or
        /// --api-keys-file, every other team's snapshots and templates go.
        #[arg(long = "keep-team", value_name = "TEAM")]
        keep_teams: Vec<String>,
        /// The gateways' API keys file (`KEY TEAM` a line): its teams are
        /// the ones that still exist.
        #[arg(long)]
        api_keys_file: Option<PathBuf>,
        /// Say what would go; remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Copies every blob of the store (the layers of its templates,
    /// snapshots and paused sandboxes) to a blob store, verified, skipping
    /// what is there already; prints how many and how large.
    Push {
        /// The blob store: a directory, s3://bucket[/prefix],
        /// gs://bucket[/prefix] or az://container[/prefix].
        #[arg(long)]
        to: String,
        /// A blob store option (endpoint, region, allow_http, ...).
        /// Credentials come from the environment (AWS_ACCESS_KEY_ID,
        /// AWS_SECRET_ACCESS_KEY, ...) or the cloud's files, never from here.
        #[arg(long = "blob-option", value_name = "KEY=VALUE")]
        options: Vec<String>,
        /// Then import the store's templates (the operator's: not teams'
        /// snapshots) into the records of the gateway at --api-url
        /// (E2B_API_URL), whose --blob-store is `--to`, with an operator
        /// key (E2B_API_KEY or --api-key-file; a team the gateway names in
        /// --admin-team).
        #[arg(long)]
        import: bool,
        #[command(flatten)]
        api: super::ApiArgs,
    },
}

/// Runs `warren template ...`; `args[0]` is the program name.
pub fn run(args: Vec<OsString>) -> ExitCode {
    if super::names_api_key(&args) {
        eprintln!("warren template: {}", super::API_KEY_REFUSED);
        return ExitCode::from(super::EX_CONFIG as u8);
    }
    let cli: Cli = match super::parse_or_exit(args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    match execute(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("warren template: {e}");
            ExitCode::FAILURE
        }
    }
}

fn execute(cli: Cli) -> Result<(), String> {
    let store = Store::open(&cli.template_dir).map_err(|e| e.to_string())?;
    match cli.cmd {
        Cmd::Build { file, force } => {
            let t = build_file(&store, &file, force)?;
            println!("{} {}", t.name, t.digest);
        }
        Cmd::Import {
            tarball,
            name,
            user,
            workdir,
            cpu_count,
            memory_mb,
            disk_mb,
        } => {
            let defaults = Defaults {
                user,
                workdir,
                cpu_count,
                memory_mb,
                disk_mb,
                ..Defaults::default()
            };
            let t = build::import(&tarball, &name, defaults, &store).map_err(|e| e.to_string())?;
            println!("{} {}", t.name, t.digest);
        }
        Cmd::Push {
            to,
            options,
            import,
            api,
        } => push(&store, &to, &options, import.then_some(&api))?,
        Cmd::Gc {
            grace,
            keep_teams,
            api_keys_file,
            dry_run,
        } => gc(&store, grace, keep_teams, api_keys_file, dry_run)?,
        Cmd::Ls => {
            for t in store.list().map_err(|e| e.to_string())? {
                println!(
                    "{}\t{}\t{} CPU\t{} MiB\t{} MiB disk\t{}",
                    t.name,
                    t.digest,
                    t.defaults.cpu_count,
                    t.defaults.memory_mb,
                    t.defaults.disk_mb,
                    t.source
                );
            }
        }
    }
    Ok(())
}

/// `warren template gc`: see [`Cmd::Gc`].
fn gc(
    store: &Store,
    grace: std::time::Duration,
    mut keep: Vec<String>,
    api_keys_file: Option<PathBuf>,
    dry_run: bool,
) -> Result<(), String> {
    if let Some(file) = &api_keys_file {
        let text = warren_gateway::config::read_private(file, "--api-keys-file")
            .map_err(|e| e.to_string())?;
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("").trim();
            if let Some((_, team)) = line.split_once(char::is_whitespace) {
                keep.push(team.trim().to_string());
            }
        }
    }
    let keep_teams =
        (!keep.is_empty() || api_keys_file.is_some()).then(|| keep.into_iter().collect());
    let before = store.usage().map_err(|e| e.to_string())?;
    let report = store
        .gc(&warren_template::gc::GcOptions {
            grace,
            keep_teams,
            dry_run,
        })
        .map_err(|e| e.to_string())?;
    let verb = if dry_run { "would remove" } else { "removed" };
    for g in &report.records {
        println!("{verb} record {} ({})", g.what, g.why);
    }
    for g in report.layers.iter().chain(&report.scratch) {
        println!("{verb} {} ({} bytes: {})", g.what, g.bytes, g.why);
    }
    for g in &report.kept {
        println!("kept {} ({} bytes: {})", g.what, g.bytes, g.why);
    }
    let after = store.usage().map_err(|e| e.to_string())?;
    let show = |u: &warren_template::gc::Usage| {
        format!(
            "{} records, {} blobs ({} bytes), {} unpacked trees ({} bytes)",
            u.records, u.blobs, u.blob_bytes, u.trees, u.tree_bytes
        )
    };
    println!("{}: before: {}", store.path().display(), show(&before));
    if dry_run {
        println!(
            "{}: {verb} {} records and {} bytes (dry run: nothing changed)",
            store.path().display(),
            report.records.len(),
            report.bytes()
        );
    } else {
        println!("{}: after:  {}", store.path().display(), show(&after));
    }
    Ok(())
}

/// `warren template push`: every blob of `store` into the blob store `to`,
/// then, with `import`, the operator's records into that gateway's.
fn push(
    store: &Store,
    to: &str,
    options: &[String],
    import: Option<&super::ApiArgs>,
) -> Result<(), String> {
    let opts = warren_blob::parse_options(options, "--blob-option")?;
    let blobs = warren_blob::BlobStore::open(to, &opts).map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let mut bytes = 0u64;
    let list = store.blobs().map_err(|e| e.to_string())?;
    rt.block_on(async {
        for (digest, file) in &list {
            let (put, size) = blobs.put_file(file).await.map_err(|e| e.to_string())?;
            if put.as_str() != digest {
                return Err(format!(
                    "{}: its bytes hash to {put}, not to its name: the template store is \
                     damaged there (the blob store holds those bytes under their own name, \
                     which nothing names)",
                    file.display()
                ));
            }
            bytes += size;
        }
        Ok(())
    })?;
    println!("{} blobs ({bytes} bytes) are in {blobs}", list.len());
    let Some(api) = import else {
        return Ok(());
    };
    let records: Vec<warren_template::Template> = store
        .list()
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|t| t.snapshot.is_none())
        .collect();
    let names: Vec<String> = records.iter().map(|t| t.name.clone()).collect();
    let client = api.client().map_err(|e| e.to_string())?;
    let body = serde_json::to_value(&records).map_err(|e| e.to_string())?;
    let answer = rt
        .block_on(client.post_json("/_warren/v1/templates", &body))
        .map_err(|e| format!("importing the templates through {}: {e}", api.api_url))?;
    println!(
        "{} templates imported through {}: {}",
        answer["imported"].as_u64().unwrap_or(0),
        api.api_url,
        names.join(", ")
    );
    Ok(())
}

/// Builds `file` into `store` unless that template is there and up to date
/// (see [`build_stamp`]; `force` rebuilds anyway); progress lines go to
/// stderr.
pub fn build_file(
    store: &Store,
    file: &Path,
    force: bool,
) -> Result<warren_template::Template, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let dir = file.parent().unwrap_or(Path::new("."));
    let spec = Spec::parse_in(&text, dir).map_err(|e| format!("{}: {e}", file.display()))?;
    let stamp = build_stamp(store, &text, &spec);
    if !force {
        if let Ok(t) = store.get(&spec.name) {
            if t.source.contains(&stamp) {
                eprintln!("template {} is up to date ({})", t.name, t.digest);
                return Ok(t);
            }
        }
    }
    build_spec(store, &spec, &stamp, &file.display().to_string())
}

/// Builds the template a build file's `text` describes (one without
/// `source` files: there is no directory to read them from).
pub fn build_text(
    store: &Store,
    text: &str,
    origin: &str,
) -> Result<warren_template::Template, String> {
    let spec = Spec::parse(text).map_err(|e| format!("{origin}: {e}"))?;
    if spec.has_sources() {
        return Err(format!(
            "{origin}: its files name sources; build it from its file (warren template build FILE)"
        ));
    }
    build_spec(store, &spec, &build_stamp(store, text, &spec), origin)
}

fn build_spec(
    store: &Store,
    spec: &Spec,
    stamp: &str,
    origin: &str,
) -> Result<warren_template::Template, String> {
    let mut t = build::build(spec, store, |line| eprintln!("{line}")).map_err(|e| e.to_string())?;
    t.source = format!("{} from {origin} ({stamp})", t.source);
    store.put(&t).map_err(|e| e.to_string())?;
    Ok(t)
}

/// What a template built from `text` records to be recognised: a digest of
/// everything that decides its contents — the build file's text, the text
/// of each `source` file, the keyring's SHA-256, and the digest of the template it is built
/// `from` (so rebuilding `base` rebuilds what derives from it).
pub fn build_stamp(store: &Store, text: &str, spec: &Spec) -> String {
    if spec.from.is_none() && !spec.has_sources() {
        return spec_stamp(text);
    }
    let mut all = text.to_string();
    if let Some(k) = &spec.keyring_path {
        // Unreadable: a stamp no build has, so the build runs (and says why).
        let digest = warren_template::store::sha256_file(k).unwrap_or_default();
        all.push_str(&format!("\0keyring {digest}"));
    }
    for f in spec.files.iter().filter(|f| f.source.is_some()) {
        all.push('\0');
        all.push_str(&f.path);
        all.push('\0');
        all.push_str(&f.content);
    }
    if let Some(from) = &spec.from {
        let parent = store.get(from).map(|t| t.digest).unwrap_or_default();
        all.push_str(&format!("\0from {from} {parent}"));
    }
    spec_stamp(&all)
}

/// The stamp of a build file's text alone (a template with neither `from`
/// nor `source` files: `base`).
pub fn spec_stamp(text: &str) -> String {
    format!("spec {}", spec_digest(text))
}

/// A short digest of a build file's text (enough to notice an edit; the
/// template itself is addressed by the SHA-256 of its contents).
fn spec_digest(text: &str) -> String {
    format!("{:016x}", warren_core::id::fnv1a(text.as_bytes()))
}
