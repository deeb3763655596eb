//! What a sandbox's environment variables (E2B's `envVars`) may be.
//!
//! They are tenant data: warren never puts them in the environment of a
//! host-side process (envd applies them inside the sandbox, to the
//! processes it starts). Variables that steer the dynamic loader or libc's
//! file lookups are refused all the same, at the gateway and again at the
//! node, so a mistake elsewhere cannot turn them into code execution.
//!
//! [`check_shape`] is what any variable must be for a program to get it at
//! all (the kernel refuses the rest with `E2BIG`); envd applies it to the
//! `envs` of each process it starts. [`check_var`] adds the refusals above
//! for a create's `envVars`.

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

/// Checks that a program can be given this variable: a name that is
/// non-empty and has no `=` or NUL, a value without NUL, and `NAME=value`
/// within [`MAX_VAR_BYTES`]. The error names the variable and the limit.
pub fn check_shape(name: &str, value: &str) -> Result<(), String> {
    if name.is_empty() || name.contains('=') || name.contains('\0') {
        return Err(format!(
            "env var name {name:?} is not allowed: it must be non-empty, without '=' or NUL"
        ));
    }
    if value.contains('\0') {
        return Err(format!("env var {name:?}: the value contains NUL"));
    }
    let len = name.len() + 1 + value.len();
    if len > MAX_VAR_BYTES {
        return Err(format!(
            "env var {name:?} is too long: NAME=value is {len} bytes, the limit is \
             {MAX_VAR_BYTES} bytes (the kernel's largest single environment string)"
        ));
    }
    Ok(())
}

/// Checks one variable of a create; the error names it and says why.
pub fn check_var(name: &str, value: &str) -> Result<(), String> {
    check_shape(name, value)?;
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
        // One byte over: NAME=value is MAX_VAR_BYTES + 1, and the message
        // says by how much.
        let err = check_shape("FOO", &"x".repeat(MAX_VAR_BYTES - 3)).expect_err("too long");
        assert!(
            err.contains("131072 bytes") && err.contains("131071"),
            "{err}"
        );
        // The shape check leaves tenant-chosen loader variables alone.
        assert!(check_shape("LD_LIBRARY_PATH", "/opt/lib").is_ok());
    }
}
