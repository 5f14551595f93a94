//! What the master and its client share of TLS (feature `tls`): rustls on ring, and PEM
//! certificates read from a file.

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// The crypto both sides use: ring (no C toolchain beyond ring's, no OpenSSL).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every PEM certificate in `path`, at least one; errors name the `flag` it came from.
pub fn certificates(path: &Path, flag: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{flag} {}: no certificate in it", path.display()));
    }
    Ok(certs)
}
