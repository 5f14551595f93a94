//! The job service's access token: every call to `vans-master` presents it
//! (`Authorization: Bearer <token>`), from `VANS_MASTER_TOKEN` or a token file.
//!
//! The master compares what a caller presents with its own token in constant time: both
//! are hashed with SHA-256 and the digests compared without an early exit, so the time
//! says nothing of how much of a guess was right (not even its length).

use std::path::Path;

use sha2::{Digest, Sha256};

/// The variable that holds the token, for the master and for `vans-submit`.
pub const TOKEN_ENV: &str = "VANS_MASTER_TOKEN";

/// A token (never printed: its `Debug` says only that it is one).
#[derive(Clone)]
pub struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// A token from text: surrounding white space goes (a file's final newline); what is
    /// left must be at least 16 characters, a printable ASCII word (it travels in a
    /// header).
    pub fn new(text: &str) -> Result<Token, String> {
        let token = text.trim();
        if token.len() < 16 {
            return Err(format!(
                "the token has {} characters; use at least 16 (e.g. `openssl rand -hex 32`)",
                token.len()
            ));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the token must be printable ASCII without spaces".into());
        }
        Ok(Token(token.to_owned()))
    }

    /// The token `VANS_MASTER_TOKEN` or the file at `file` holds (one of them, not both), or
    /// `None` when neither is given. Errors name the source, never the token.
    pub fn from_env_or_file(file: Option<&Path>) -> Result<Option<Token>, String> {
        let from_env = std::env::var(TOKEN_ENV)
            .ok()
            .filter(|t| !t.trim().is_empty());
        match (from_env, file) {
            (Some(_), Some(_)) => Err(format!(
                "{TOKEN_ENV} and a token file are both given: use one of them"
            )),
            (Some(text), None) => Token::new(&text)
                .map(Some)
                .map_err(|e| format!("{TOKEN_ENV}: {e}")),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
                Token::new(&text)
                    .map(Some)
                    .map_err(|e| format!("token file {}: {e}", path.display()))
            }
            (None, None) => Ok(None),
        }
    }

    /// The token's text, for a client's `Authorization` header.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this token, compared in constant time.
    pub fn matches(&self, presented: &str) -> bool {
        let (ours, theirs) = (
            Sha256::digest(self.0.as_bytes()),
            Sha256::digest(presented.as_bytes()),
        );
        ours.iter()
            .zip(theirs.iter())
            .fold(0u8, |differ, (a, b)| differ | (a ^ b))
            == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_only_themselves_and_short_ones_are_refused() {
        let token = Token::new("  0123456789abcdef0123\n").unwrap();
        assert!(token.matches("0123456789abcdef0123"));
        for other in ["", "0123456789abcdef012", "0123456789abcdef01234", "x"] {
            assert!(!token.matches(other), "{other:?}");
        }
        assert!(Token::new("short").unwrap_err().contains("at least 16"));
        assert!(Token::new("has a space in it ok").is_err());
        assert_eq!(format!("{token:?}"), "Token(..)");
    }
}
