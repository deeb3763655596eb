//! Configuration: CLI flags, `WARREN_*` environment variables and an optional
//! TOML file, in that order of precedence, over the defaults.
//!
//! Every component's options are one `clap::Parser` struct with `env = ...` on
//! each field. [`load`] parses the command line, and when `--config FILE` is
//! given, feeds each TOML key whose flag was neither given on the command line
//! nor in the environment back through clap, so TOML values are validated by
//! the very same parsers as flags. Keys are the long flag names (`listen`,
//! `lease-ms`, ...; `_` and `-` are equivalent).
//!
//! Any error — unknown key, bad value, unreadable file — is a [`ConfigError`],
//! which the binary prints and exits with [`EX_CONFIG`] (64, `EX_USAGE`).

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches};
use std::ffi::OsString;
use std::path::Path;

/// Exit code for bad configuration (sysexits' `EX_USAGE`).
pub const EX_CONFIG: i32 = 64;

/// A configuration error, with a message that names the problem.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid TOML: {message}")]
    Toml { path: String, message: String },
    #[error("config file {path}: unknown setting {key:?}")]
    UnknownKey { path: String, key: String },
    #[error("config file {path}: setting {key:?} must be a string, number or boolean")]
    BadType { path: String, key: String },
    #[error("{0}")]
    Invalid(String),
    /// Not an error: `--help` or `--version` was asked for; the text to print.
    #[error("{0}")]
    Help(String),
}

fn clap_error(e: clap::Error, context: &str) -> ConfigError {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            ConfigError::Help(e.render().to_string())
        }
        _ => ConfigError::Invalid(format!("{context}{}", e.render())),
    }
}

/// Parses `T` from the given arguments (the first being the program name),
/// the environment, and `config_file` if one is named.
pub fn load_from<T, I>(args: I, config_file: Option<&Path>) -> Result<T, ConfigError>
where
    T: CommandFactory + FromArgMatches,
    I: IntoIterator<Item = OsString>,
{
    let args: Vec<OsString> = args.into_iter().collect();
    let cmd = T::command().args_override_self(true);
    let matches = cmd
        .clone()
        .try_get_matches_from(args.clone())
        .map_err(|e| clap_error(e, ""))?;
    let Some(path) = config_file else {
        return T::from_arg_matches(&matches).map_err(|e| ConfigError::Invalid(e.to_string()));
    };
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: shown.clone(),
        source,
    })?;
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfigError::Toml {
            path: shown.clone(),
            message: e.message().to_string(),
        })?;
    let mut injected: Vec<OsString> = Vec::new();
    for (key, value) in &table {
        let long = key.replace('_', "-");
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()))
            .ok_or_else(|| ConfigError::UnknownKey {
                path: shown.clone(),
                key: key.clone(),
            })?;
        if explicitly_set(&matches, arg.get_id().as_str()) {
            continue;
        }
        let values: Vec<String> = match value {
            toml::Value::Array(items) => items
                .iter()
                .map(|v| scalar(v, &shown, key))
                .collect::<Result<_, _>>()?,
            v => vec![scalar(v, &shown, key)?],
        };
        if !arg.get_action().takes_values() {
            // A switch (`--flag`): `true` turns it on, `false` leaves it off.
            match values.as_slice() {
                [v] if v == "true" => injected.push(format!("--{long}").into()),
                [v] if v == "false" => {}
                _ => {
                    return Err(ConfigError::Invalid(format!(
                        "config file {shown}: setting {key:?} is a switch; use true or false"
                    )))
                }
            }
            continue;
        }
        for v in values {
            injected.push(format!("--{long}={v}").into());
        }
    }
    // Injected TOML values go first so that explicit flags later on the line win.
    let mut merged = Vec::with_capacity(args.len() + injected.len());
    merged.extend(args.first().cloned());
    merged.extend(injected);
    merged.extend(args.into_iter().skip(1));
    let matches = cmd
        .try_get_matches_from(merged)
        .map_err(|e| clap_error(e, &format!("in {shown}: ")))?;
    T::from_arg_matches(&matches).map_err(|e| ConfigError::Invalid(e.to_string()))
}

fn explicitly_set(matches: &ArgMatches, id: &str) -> bool {
    matches!(
        matches.value_source(id),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    )
}

fn scalar(v: &toml::Value, path: &str, key: &str) -> Result<String, ConfigError> {
    match v {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        _ => Err(ConfigError::BadType {
            path: path.to_string(),
            key: key.to_string(),
        }),
    }
}

/// Whether `args` (a process's own command line, which every account on
/// the host can read in `/proc/<pid>/cmdline`) give `flag`, as `flag VALUE`
/// or `flag=VALUE`: the parts refuse secrets there.
pub fn names_flag<I, S>(args: I, flag: &str) -> bool
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    args.into_iter().any(|a| {
        let a = a.as_ref().to_string_lossy();
        a == flag
            || a.strip_prefix(flag)
                .is_some_and(|rest| rest.starts_with('='))
    })
}

/// Parses a duration such as `500ms`, `2s`, `5m`, `1h` or a bare number of
/// seconds. Used as a clap `value_parser` for every duration setting.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (try 500ms, 2s, 5m, 1h)"))?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        other => {
            return Err(format!(
                "unknown duration unit {other:?} in {s:?} (use ms, s, m or h)"
            ))
        }
    };
    if !(0.0..=365.0 * 86_400.0).contains(&secs) {
        return Err(format!("duration {s:?} is out of range"));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::time::Duration;

    #[test]
    fn names_flag_finds_both_spellings_and_no_longer_flag() {
        assert!(names_flag(["warren", "--api-key", "k"], "--api-key"));
        assert!(names_flag(["warren", "--api-key=k"], "--api-key"));
        assert!(!names_flag(["warren", "--api-keys-file", "f"], "--api-key"));
        assert!(!names_flag(["warren", "--api-key-file=f"], "--api-key"));
        assert!(!names_flag(["warren", "api-key"], "--api-key"));
    }

    #[derive(Parser, Debug)]
    struct Opts {
        #[arg(long, env = "WARREN_TEST_CFG_LISTEN", default_value = "127.0.0.1:1")]
        listen: String,
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        lease: Duration,
        #[arg(long)]
        flag: bool,
    }

    fn args(a: &[&str]) -> Vec<OsString> {
        std::iter::once("t")
            .chain(a.iter().copied())
            .map(Into::into)
            .collect()
    }

    #[test]
    fn toml_fills_what_flags_leave_unset() {
        let dir = std::env::temp_dir().join(format!("warren-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(
            &file,
            "listen = \"127.0.0.1:9\"\nlease = \"3s\"\nflag = true\n",
        )
        .unwrap();
        let o: Opts = load_from(args(&["--lease", "4s"]), Some(&file)).unwrap();
        assert_eq!(o.listen, "127.0.0.1:9");
        assert_eq!(o.lease, Duration::from_secs(4), "flag beats file");
        assert!(o.flag);

        std::fs::write(&file, "nope = 1\n").unwrap();
        let err = load_from::<Opts, _>(args(&[]), Some(&file)).unwrap_err();
        assert!(
            err.to_string().contains("unknown setting \"nope\""),
            "{err}"
        );

        std::fs::write(&file, "lease = \"soon\"\n").unwrap();
        let err = load_from::<Opts, _>(args(&[]), Some(&file)).unwrap_err();
        assert!(err.to_string().contains("soon"), "{err}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
