//! `vans_config`: a node's configuration given in code, as the same name–value pairs the
//! environment would carry (`DMLC_ROLE`, `DMLC_NUM_SERVER`, `DMLC_PS_ROOT_URI`, `TF_CONFIG`,
//! `PS_VERBOSE`, every variable of the book's Configuration chapter), parsed by the same code
//! ([`van_core::Config::from_vars`]) when the node starts.

use std::ffi::{c_char, c_int};

use van_core::config::VARIABLES;

use crate::args;
use crate::error::{guard, Failure};

/// Most variables one configuration holds (more than there are names: a name set twice keeps
/// one entry).
const MAX_VARIABLES: usize = 1024;

/// A node's configuration, built with `vans_config_set`; opaque to C.
#[derive(Debug, Default)]
pub struct Config {
    vars: Vec<(String, String)>,
}

impl Config {
    /// The parsed configuration.
    pub(crate) fn parse(&self) -> Result<van_core::Config, Failure> {
        Ok(van_core::Config::from_vars(
            self.vars.iter().map(|(name, value)| (name, value)),
        )?)
    }
}

/// Creates an empty configuration (every variable at its default) in `*out`.
///
/// Ownership: the caller owns `*out` and releases it with `vans_config_free`.
/// Thread-safety: a configuration is not synchronized; use it from one thread at a time.
///
/// # Safety
///
/// `out` must be valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn vans_config_new(out: *mut *mut Config) -> c_int {
    guard("vans_config_new", || {
        // SAFETY: writable by the caller's contract.
        unsafe { args::write_handle(out, "out", Config::default()) }
    })
}

/// Sets the variable `name` to `value`, as if `name=value` were in the environment: e.g.
/// `vans_config_set(c, "DMLC_ROLE", "worker")`, `"DMLC_NUM_SERVER"`, `"DMLC_NUM_WORKER"`,
/// `"DMLC_PS_ROOT_URI"`, `"DMLC_PS_ROOT_PORT"`, `"DMLC_NODE_HOST"`, `"TF_CONFIG"`,
/// `"PS_VERBOSE"`. Setting a name again replaces its value. Values are checked when the node
/// starts (`vans_node_start` then fails with `VANS_ERR_CONFIG` naming the variable); a name
/// the library does not read is `VANS_ERR_INVALID_ARGUMENT` at once.
///
/// Ownership: both strings are copied; the caller keeps them. Thread-safety: not with other
/// calls on the same configuration.
///
/// # Safety
///
/// `config` must be a live configuration or NULL; `name` and `value` NUL-terminated strings
/// or NULL.
#[no_mangle]
pub unsafe extern "C" fn vans_config_set(
    config: *mut Config,
    name: *const c_char,
    value: *const c_char,
) -> c_int {
    guard("vans_config_set", || {
        // SAFETY: live or NULL by the caller's contract.
        let config = unsafe { args::handle_mut(config, "config") }?;
        // SAFETY: NUL-terminated or NULL by the caller's contract.
        let name = unsafe { args::text(name, "name") }?;
        // SAFETY: as above.
        let value = unsafe { args::text(value, "value") }?;
        if !VARIABLES.iter().any(|known| known.name == name) {
            return Err(Failure::invalid(format!(
                "{name:?} is not a variable vans reads (see the Configuration chapter of the \
                 book, docs/src/operators/configuration.md, e.g. DMLC_ROLE, DMLC_NUM_SERVER, \
                 DMLC_PS_ROOT_URI)"
            )));
        }
        if let Some(entry) = config.vars.iter_mut().find(|(known, _)| known == name) {
            entry.1 = value.to_owned();
        } else if config.vars.len() < MAX_VARIABLES {
            config.vars.push((name.to_owned(), value.to_owned()));
        } else {
            return Err(Failure::invalid(format!(
                "a configuration holds at most {MAX_VARIABLES} variables"
            )));
        }
        Ok(())
    })
}

/// Releases a configuration; NULL is ignored. A node started from it does not need it any
/// more.
///
/// # Safety
///
/// `config` must come from `vans_config_new` and not be used after this call.
#[no_mangle]
pub unsafe extern "C" fn vans_config_free(config: *mut Config) {
    // SAFETY: forwarded contract.
    unsafe { args::free_handle("vans_config_free", config) }
}
