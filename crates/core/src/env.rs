//! What a sandbox's environment variables (E2B's `envVars`) may be.
//!
//! They are tenant data: warren never puts them in the environment of a
//! host-side process (envd applies them inside the sandbox, to the
//! processes it starts). Variables that steer the dynamic loader or libc's
//! file lookups are refused all the same, at the gateway and again at the
//! node, so a mistake elsewhere cannot turn them into code execution.

/// The largest `NAME=value` the kernel passes to a program (`MAX_ARG_STRLEN`).
pub const MAX_VAR_BYTES: usize = 128 * 1024 - 1;

/// Names refused besides every `LD_*` (glibc's "unsecure" variables that
/// load code or files).
const LOADER_VARS: &[&str] = &[
    "GCONV_PATH",
    "GETCONF_DIR",
    "GLIBC_TUNABLES",
    "HOSTALIASES",
    "LOCALDOMAIN",
    "LOCPATH",
    "MALLOC_TRACE",
    "NIS_PATH",
    "NLSPATH",
    "RESOLV_HOST_CONF",
    "RES_OPTIONS",
];

/// Checks one variable; the error names it and says why.
pub fn check_var(name: &str, value: &str) -> Result<(), String> {
    if name.is_empty() || name.contains('=') || name.contains('\0') {
        return Err(format!(
            "env var name {name:?} is not allowed: it must be non-empty, without '=' or NUL"
        ));
    }
    if name.starts_with("WARREN_") {
        return Err(format!(
            "env var {name:?} is not allowed: the WARREN_ prefix is reserved"
        ));
    }
    if name.starts_with("LD_") || LOADER_VARS.contains(&name) {
        return Err(format!(
            "env var {name:?} is not allowed: it steers the dynamic loader or libc; \
             set it in the command instead"
        ));
    }
    if value.contains('\0') {
        return Err(format!("env var {name:?}: the value contains NUL"));
    }
    if name.len() + 1 + value.len() > MAX_VAR_BYTES {
        return Err(format!(
            "env var {name:?} is too long: NAME=value may have at most {MAX_VAR_BYTES} bytes"
        ));
    }
    Ok(())
}

/// Checks every variable of a create.
pub fn check_vars<'a>(
    vars: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<(), String> {
    vars.into_iter().try_for_each(|(k, v)| check_var(k, v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loader_and_reserved_variables_are_refused() {
        for bad in [
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "LD_AUDIT",
            "GCONV_PATH",
            "WARREN_X",
            "",
            "A=B",
        ] {
            let err = check_var(bad, "x").expect_err(bad);
            assert!(err.contains("not allowed"), "{err}");
        }
        assert!(check_var("PATH", "/bin").is_ok());
        assert!(check_var("FOO", "a\0b").is_err());
        assert!(check_var("FOO", &"x".repeat(MAX_VAR_BYTES)).is_err());
        assert!(check_var("FOO", &"x".repeat(MAX_VAR_BYTES - 4)).is_ok());
    }
}
