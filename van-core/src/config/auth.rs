//! The authentication options a configuration gives ([`AuthOptions::from_config`]): here,
//! beside the fields they read, so that `auth` does not depend on `config`.

use crate::auth::AuthOptions;
use crate::Config;

impl AuthOptions {
    /// The secret, timeout and bound of `config`.
    pub fn from_config(config: &Config) -> AuthOptions {
        AuthOptions {
            secret: config.cluster_secret.clone(),
            handshake_timeout: config.handshake_timeout,
            max_pending_per_address: config.max_pending_per_address,
            max_connections: config.max_connections,
            max_connections_per_address: config.max_connections_per_address,
        }
    }
}
