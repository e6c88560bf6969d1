//! Inputs the fuzz targets in `fuzz/` found, kept as tests.

/// Found by the `store_url` fuzz target: a `memory://` URL with user info
/// was refused with a reason that repeated the raw path — password
/// included — although the URL itself was shown redacted.
#[tokio::test]
async fn memory_url_errors_do_not_echo_a_password() {
    let err = limiter::store::from_url("memory://user:hunter2@host")
        .await
        .unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
}
