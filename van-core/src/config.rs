//! Placeholder, replaced by the real configuration module.

/// Configuration.
#[derive(Debug, Clone, Default)]
pub struct Config {}

/// Configuration error.
#[derive(Debug, Clone, thiserror::Error)]
#[error("config")]
pub struct ConfigError;
