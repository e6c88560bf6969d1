//! Configuration through the public API, without a server: what is refused
//! at construction, and that no password reaches an error or a `Debug`
//! output.

use ratewarden_core::ConfigError;
use ratewarden_redis::{RedisStore, URL_SCHEMES};

/// Everything a store or builder for `url` may show: the error (both
/// renderings) or the builder's and the store's `Debug` output.
fn everything_shown(url: &str) -> String {
    let builder = RedisStore::builder(url);
    let mut shown = format!("{builder:?}");
    match builder.build() {
        Ok(store) => shown.push_str(&format!(" {store:?}")),
        Err(e) => shown.push_str(&format!(" {e} {e:?}")),
    }
    shown
}

#[test]
fn passwords_never_leak_in_errors_or_debug() {
    // (URL, fragments of its password that must never be shown)
    let cases: &[(&str, &[&str])] = &[
        ("redis+unix:///s.sock?pass=hunter2", &["hunter2"]),
        ("redis://:pa/ss@host", &["pa/ss", ":pa", "ss@"]),
        ("redis://app:hunter2@host:6379/0", &["hunter2"]),
        ("redis://app:hunter2@host:notaport", &["hunter2"]),
        ("redis://:hunter2@host/notadb", &["hunter2"]),
        ("unix:///s.sock?pass=hunter2&db=1", &["hunter2"]),
        ("redis+cluster://u:hunter2@a:1,b:2", &["hunter2"]),
        ("redis+cluster://u:hunter2@a:1,b", &["hunter2"]),
        ("rediss://u:hunter2@h:1/#insecure", &["hunter2"]),
        ("nope://u:hunter2@h", &["hunter2"]),
    ];
    for (url, secrets) in cases {
        let shown = everything_shown(url);
        for secret in *secrets {
            // Not even four characters of it in a row.
            for part in secret.as_bytes().windows(4.min(secret.len())) {
                let part = std::str::from_utf8(part).unwrap();
                assert!(
                    !shown.contains(part),
                    "{url} leaked {part:?} of {secret:?}: {shown}"
                );
            }
        }
    }
    // The redacted forms still say where the store points.
    let shown = everything_shown("redis+unix:///s.sock?pass=hunter2");
    assert!(shown.contains("redis+unix:///s.sock?pass=***"), "{shown}");
    let shown = everything_shown("redis+cluster://u:hunter2@a:1,b:2");
    assert!(shown.contains("redis+cluster://u:***@a:1,b:2"), "{shown}");
}

#[test]
fn unusable_urls_are_refused_with_the_url_redacted() {
    for url in [
        "",
        "localhost:6379",
        "http://localhost",
        "redis://host:notaport",
        "redis://:pw@host:99999",
        "redis+cluster://",
        "redis+cluster://a:1,b",
        "rediss+cluster://a:1,b",
        "redis+sentinel://a:1",
    ] {
        let err = RedisStore::from_url(url).unwrap_err();
        assert!(
            matches!(err, ConfigError::InvalidUrl { .. }),
            "{url}: {err}"
        );
    }
    let err = RedisStore::from_url("ftp://h").unwrap_err();
    for scheme in URL_SCHEMES {
        assert!(err.to_string().contains(&format!("{scheme}://")), "{err}");
    }
}

#[test]
fn the_tls_schemes_are_listed_and_need_the_feature() {
    for url in ["rediss://cache:6379", "rediss+cluster://a:1,b:2"] {
        let scheme = url.split_once("://").unwrap().0;
        assert!(URL_SCHEMES.contains(&scheme));
        let built = RedisStore::from_url(url);
        if cfg!(feature = "tls") {
            assert!(built.is_ok(), "{built:?}");
        } else {
            let err = built.unwrap_err();
            assert!(err.to_string().contains("`tls` feature"), "{err}");
        }
    }
}
