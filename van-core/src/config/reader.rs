//! [`Vars`]: the variables given, and typed reads of one of them. Every parser reads
//! through it, so errors name the variable, its value and what is accepted.

use std::collections::HashMap;

use super::error::ConfigError;
use super::variables::known_name;
use super::POSITIVE_EXPECTED;

/// The variables given, restricted to known names with non-empty, trimmed values.
pub(super) struct Vars {
    pub(super) map: HashMap<&'static str, String>,
}

impl Vars {
    pub(super) fn get(&self, var: &'static str) -> Option<&str> {
        debug_assert!(known_name(var).is_some(), "{var} is missing from VARIABLES");
        self.map.get(var).map(String::as_str)
    }

    pub(super) fn invalid(&self, var: &'static str, expected: &'static str) -> ConfigError {
        ConfigError::Invalid {
            var,
            value: self.get(var).unwrap_or_default().to_owned(),
            expected,
        }
    }

    pub(super) fn number<T: std::str::FromStr>(
        &self,
        var: &'static str,
        expected: &'static str,
    ) -> Result<Option<T>, ConfigError> {
        self.get(var)
            .map(|value| value.parse().map_err(|_| self.invalid(var, expected)))
            .transpose()
    }

    pub(super) fn positive(&self, var: &'static str) -> Result<Option<u64>, ConfigError> {
        match self.number::<u64>(var, POSITIVE_EXPECTED)? {
            Some(0) => Err(self.invalid(var, POSITIVE_EXPECTED)),
            other => Ok(other),
        }
    }

    /// A boolean variable: `0`/`false` or `1`/`true` (any case).
    pub(super) fn flag(&self, var: &'static str) -> Result<Option<bool>, ConfigError> {
        let Some(value) = self.get(var) else {
            return Ok(None);
        };
        match value.to_ascii_lowercase().as_str() {
            "0" | "false" => Ok(Some(false)),
            "1" | "true" => Ok(Some(true)),
            _ => Err(self.invalid(var, "`0`, `false`, `1` or `true`")),
        }
    }

    /// A number with two names (ours, then BytePS's): either may be set; both must agree.
    pub(super) fn alias_number(
        &self,
        names: &'static [&'static str; 2],
        expected: &'static str,
    ) -> Result<Option<u32>, ConfigError> {
        match (
            self.number::<u32>(names[0], expected)?,
            self.number::<u32>(names[1], expected)?,
        ) {
            (Some(a), Some(b)) if a != b => Err(ConfigError::Contradiction {
                vars: names,
                reason: "they set different depths; set one of them",
            }),
            (Some(a), _) | (None, Some(a)) => Ok(Some(a)),
            (None, None) => Ok(None),
        }
    }
}
