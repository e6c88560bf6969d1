//! TLS (`rediss://`, feature `tls`): rustls through the redis crate, with
//! the system's roots or a CA given to
//! [`tls_root_ca`](crate::RedisStoreBuilder::tls_root_ca).

use redis::TlsCertificates;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// The redis crate builds its rustls configuration with the process's
/// default crypto provider, and rustls panics when it has none and cannot
/// pick one (when another crate enabled a second provider). Installing ring
/// here, at construction, turns that panic at the first connection into
/// nothing at all; a provider the application installed first is kept.
pub(crate) fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err means another thread installed one meanwhile, which serves.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Trust in exactly the certificates in `pem`, checked to hold at least
/// one.
pub(crate) fn trusting(pem: &[u8]) -> Result<TlsCertificates, String> {
    let certificates = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("tls_root_ca is not valid PEM: {e}"))?;
    if certificates.is_empty() {
        // An empty trust store would fail every handshake, at the first
        // decision instead of here.
        return Err("tls_root_ca holds no PEM CERTIFICATE block".into());
    }
    Ok(TlsCertificates {
        client_tls: None,
        root_cert: Some(pem.to_vec()),
    })
}
