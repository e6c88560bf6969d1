//! Store URLs: the schemes accepted, parsing (with the workspace's one URL
//! parser, [`ratewarden_core::url`]) and the TLS modes a build can honour.

use ratewarden_core::ConfigError;
use ratewarden_core::url::{Url, redact};
use sqlx::ConnectOptions;
use sqlx::postgres::PgConnectOptions;

/// The URL schemes [`PostgresStore::from_url`](crate::PostgresStore::from_url)
/// and [`PostgresStore::builder`](crate::PostgresStore::builder) accept,
/// exactly: `postgres://…` and `postgresql://…`, as libpq spells them. Any
/// other scheme is refused when the store is built.
///
/// The rest of the URL is libpq's: `user:password@host:port/database`, and
/// parameters such as `sslmode`, `sslrootcert` or `application_name`. TLS
/// modes (`sslmode=require`, `verify-ca`, `verify-full`) need the crate's
/// `tls` feature and are refused without it.
pub const URL_SCHEMES: &[&str] = &["postgres", "postgresql"];

/// Parses a store URL into connect options, refusing what this build
/// cannot honour. Every error shows the URL redacted.
pub(crate) fn parse_url(url: &str) -> Result<PgConnectOptions, ConfigError> {
    let invalid = |reason: String| ConfigError::InvalidUrl {
        url: redact(url),
        reason,
    };
    let parsed = Url::parse(url).map_err(|e| {
        invalid(format!(
            "{e}; expected postgres://user@host:port/database (a password holding /, ?, # or @ \
             must be percent-encoded)"
        ))
    })?;
    if !URL_SCHEMES.contains(&parsed.scheme()) {
        return Err(invalid(format!(
            "scheme must be one of {}, got {:?}",
            URL_SCHEMES.join(", "),
            parsed.scheme()
        )));
    }
    let no_host = parsed.host_str().is_none_or(str::is_empty);
    if no_host && parsed.path().is_empty() && parsed.query().is_none() {
        return Err(invalid("no host".into()));
    }
    let options = PgConnectOptions::from_url(&parsed).map_err(|e| invalid(e.to_string()))?;
    check_tls(&options).map_err(invalid)?;
    Ok(options)
}

/// Refuses a TLS mode this build cannot honour. The mode is read from the
/// parsed options rather than the URL, so a `PGSSLMODE` in the environment
/// is held to the same rule.
#[cfg(not(feature = "tls"))]
pub(crate) fn check_tls(options: &PgConnectOptions) -> Result<(), String> {
    use sqlx::postgres::PgSslMode;

    let mode = match options.get_ssl_mode() {
        PgSslMode::Require => "require",
        PgSslMode::VerifyCa => "verify-ca",
        PgSslMode::VerifyFull => "verify-full",
        PgSslMode::Disable | PgSslMode::Allow | PgSslMode::Prefer => return Ok(()),
    };
    Err(format!(
        "sslmode={mode} (from the URL or PGSSLMODE) needs TLS, which this build of \
         ratewarden-postgres leaves out: enable its `tls` feature"
    ))
}

/// With the `tls` feature every mode is available.
#[cfg(feature = "tls")]
pub(crate) fn check_tls(_options: &PgConnectOptions) -> Result<(), String> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked() {
        assert!(parse_url("postgres://postgres@localhost:5432/postgres").is_ok());
        assert!(parse_url("postgresql://u:p@localhost/db").is_ok());
        assert!(parse_url("postgres:///db?host=/run/postgresql").is_ok());
        for bad in [
            "",
            "localhost:5432",
            "redis://localhost",
            "postgres://",
            "http://x",
            "postgres://u@h:notaport/db",
        ] {
            let err = parse_url(bad).unwrap_err();
            assert!(
                matches!(err, ConfigError::InvalidUrl { .. }),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn errors_never_show_a_password() {
        for url in [
            "mysql://user:hunter2@host/db",
            "postgres://app:hunter/2@db/x",
            "postgres://app:hunter2@db:notaport/x",
            "redis://app@db/x?password=hunter2",
        ] {
            let err = parse_url(url).unwrap_err();
            assert!(!err.to_string().contains("hunter"), "{url}: {err}");
            assert!(!format!("{err:?}").contains("hunter"), "{url}: {err:?}");
        }
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn tls_modes_need_the_tls_feature() {
        for mode in ["require", "verify-ca", "verify-full"] {
            let err = parse_url(&format!("postgres://u@h/db?sslmode={mode}")).unwrap_err();
            let text = err.to_string();
            assert!(text.contains(&format!("sslmode={mode}")), "{text}");
            assert!(text.contains("`tls` feature"), "{text}");
        }
        for mode in ["disable", "allow", "prefer"] {
            assert!(parse_url(&format!("postgres://u@h/db?sslmode={mode}")).is_ok());
        }
    }

    #[cfg(feature = "tls")]
    #[test]
    fn tls_modes_are_accepted_with_the_tls_feature() {
        for mode in ["require", "verify-ca", "verify-full"] {
            assert!(parse_url(&format!("postgres://u@h/db?sslmode={mode}")).is_ok());
        }
    }
}
