//! Store URLs: the one parser and the one redaction every crate of the
//! workspace uses, so that what `from_url` accepts and what an error, a
//! `Debug` output or a banner may print are decided in one place.
//!
//! Parsing is the `url` crate's (WHATWG rules, percent-decoding), not hand
//! splitting: a password holding `/`, `?`, `#` or `@` is where hand-written
//! splitters leak.

pub use url::Url;

/// Query parameters whose values are secrets, compared case-insensitively:
/// the libpq and redis-rs spellings of a password, and common token names.
const SECRET_PARAMS: &[&str] = &[
    "password",
    "pass",
    "passwd",
    "pwd",
    "sslpassword",
    "secret",
    "token",
    "auth",
];

/// Whether a query parameter's value is a secret.
pub fn is_secret_param(name: &str) -> bool {
    SECRET_PARAMS.iter().any(|s| s.eq_ignore_ascii_case(name))
}

/// `url` with every secret replaced by `***`, fit for errors, logs,
/// `Debug` output and banners: the password of the user information and the
/// value of any secret query parameter (`password=`, `pass=`, …).
///
/// A string that does not parse as a URL is not shown at all beyond its
/// scheme: a password with an unencoded `/`, `?` or `#` makes exactly such a
/// string, and the part that failed to parse may be that password.
///
/// ```
/// use ratewarden_core::url::redact;
///
/// assert_eq!(redact("postgres://app:hunter2@db/x"), "postgres://app:***@db/x");
/// assert_eq!(redact("postgres://app@db/x?password=hunter2"), "postgres://app@db/x?password=***");
/// assert_eq!(redact("redis+unix:///s.sock?pass=hunter2"), "redis+unix:///s.sock?pass=***");
/// assert_eq!(redact("postgres://app:hun/ter2@db/x"), "postgres://<not a valid URL; not shown>");
/// ```
pub fn redact(url: &str) -> String {
    let Ok(mut parsed) = Url::parse(url) else {
        return match url.split_once("://") {
            Some((scheme, _))
                if !scheme.is_empty()
                    && scheme
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) =>
            {
                format!("{scheme}://<not a valid URL; not shown>")
            }
            _ => "<not a valid URL; not shown>".to_owned(),
        };
    };
    // An `@` that did not end up separating user information from the host
    // means the user information was cut short: `postgres://app:12/x@db`
    // parses as host `app`, port `12`, path `/x@db`, and the rest of the
    // password sits in the path. Show nothing of such a URL.
    // Likewise for any `@` beyond the one separator: in the path, the query
    // or the user name, or a second one in the text (the store_url fuzz
    // target found `ftp:/\0\0@@…redis://:@host@@@…`, whose user name is
    // `\0\0@` and whose path holds `:@host@@`).
    let after_host = &parsed[url::Position::AfterPort..];
    let stray_at = url.matches('@').count() > 1
        || after_host.contains('@')
        || after_host.contains("%40")
        || parsed.username().contains("%40");
    if url.contains('@')
        && (stray_at || (parsed.username().is_empty() && parsed.password().is_none()))
    {
        return format!(
            "{}://<an '@' outside the user information; not shown>",
            parsed.scheme()
        );
    }
    if parsed.password().is_some() {
        // Only fails for URLs that cannot have a password, which this one has.
        let _ = parsed.set_password(Some("***"));
    }
    if parsed.query_pairs().any(|(k, _)| is_secret_param(&k)) {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(k, v)| {
                let v = if is_secret_param(&k) {
                    "***".to_owned()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    // The serializer percent-encodes `***` in the user information.
    parsed.to_string().replace("%2A%2A%2A", "***")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_leak_is_redacted() {
        let cases = [
            (
                "postgres://app:hunter2@db:5432/limits?sslmode=require",
                "postgres://app:***@db:5432/limits?sslmode=require",
            ),
            ("redis://cache:6379/0", "redis://cache:6379/0"),
            (
                "redis://:p@ss@cache",
                "redis://<an '@' outside the user information; not shown>",
            ),
            (
                "ftp:/\0\0@@44444444444redis://:@host@@@\x02\0memor\0\0\0\0r",
                "ftp://<an '@' outside the user information; not shown>",
            ),
            (
                "postgres://app@db/x?password=hunter2&sslmode=require",
                "postgres://app@db/x?password=***&sslmode=require",
            ),
            (
                "redis+unix:///run/redis.sock?pass=hunter2&db=1",
                "redis+unix:///run/redis.sock?pass=***&db=1",
            ),
            ("rediss://u:hunter2@cache/0", "rediss://u:***@cache/0"),
            (
                "postgres://a:b/c@db/x",
                "postgres://<not a valid URL; not shown>",
            ),
            (
                "postgres://a:b?c@db/x",
                "postgres://<not a valid URL; not shown>",
            ),
            ("redis://:b#c@db", "redis://<not a valid URL; not shown>"),
            ("not a url hunter2", "<not a valid URL; not shown>"),
            ("memory://?capacity=10", "memory://?capacity=10"),
            (
                "postgres://app:12/hunter2@db/x",
                "postgres://<an '@' outside the user information; not shown>",
            ),
            (
                "redis://cache:6379/0?x=hunter2@y",
                "redis://<an '@' outside the user information; not shown>",
            ),
        ];
        for (url, want) in cases {
            let got = redact(url);
            assert_eq!(got, want, "{url}");
            assert!(!got.contains("hunter2"), "{url} leaked: {got}");
        }
    }

    #[test]
    fn secret_parameter_names_ignore_case() {
        assert!(is_secret_param("PASSWORD"));
        assert!(is_secret_param("Pass"));
        assert!(!is_secret_param("passive"));
    }
}
