//! Inputs the fuzz targets in `fuzz/` found, kept as tests.

/// Found by the `store_url` fuzz target: a `memory://` URL with user info
/// was refused with a reason that repeated the raw path — password
/// included — although the URL itself was shown redacted.
#[tokio::test]
async fn memory_url_errors_do_not_echo_a_password() {
    let err = ratewarden::store::from_url("memory://user:hunter2@host")
        .await
        .unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
}

/// Found by the `store_url` fuzz target: a URL whose text before its first
/// `://` holds a password. The Redis store echoed that text as the
/// "unsupported scheme"; it now names a scheme only when it is one.
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_password_after_garbage_is_not_echoed() {
    for (url, secret) in [
        (
            "redis:@@@//:secreT@hocr\0e\0\0\0\0\0ors://:secret@hocr\0Y\0t",
            "secret",
        ),
        // An `@` in the user name and `:@host@@` in the path: the URL is
        // not shown at all.
        (
            "ftp:/\0\0@@44444444444redis://:@host@@@\x02\0memor\0\0\0\0r",
            "@host@@",
        ),
    ] {
        // Neither is a URL either store accepts: each is refused, and the
        // refusal must not quote the password.
        let err = ratewarden::store::from_url(url)
            .await
            .expect_err("garbage is not a store URL");
        for text in [err.to_string(), format!("{err:?}")] {
            assert!(!text.contains(secret), "{text}");
        }
        let err =
            ratewarden::redis::RedisStore::from_url(url).expect_err("garbage is not a Redis URL");
        for text in [err.to_string(), format!("{err:?}")] {
            assert!(!text.contains(secret), "{text}");
        }
    }
}

/// Found by the `store_url` fuzz target: a `memory://` URL whose query
/// holds a URL with a password; the unknown parameter's name was echoed.
#[tokio::test]
async fn a_memory_parameter_is_echoed_only_when_it_is_a_plain_word() {
    let url = "memory:/?caredmory://r0.r:Achd\u{18a}eo:@sms++i/d/pa/ry://user://er:Achd\u{18a}s@m:";
    let err = ratewarden::store::from_url(url)
        .await
        .unwrap_err()
        .to_string();
    assert!(!err.contains("Achd"), "{err}");
    let err = ratewarden::store::from_url("memory://?size=3")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown parameter \"size\""), "{err}");
}
