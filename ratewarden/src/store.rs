//! Opening a store from a URL, with the backends this build was compiled
//! with.
//!
//! | URL | Cargo feature | store |
//! |---|---|---|
//! | `memory://` or `memory://?capacity=N` | `memory` (default) | in-process, at most `N` keys (default [`DEFAULT_MEMORY_CAPACITY`]) |
//! | `redis://…`, `redis+unix://…`, `unix://…`, `redis+cluster://…`, `redis+sentinel://…`; `rediss://…` | `redis`; `rediss` also `tls` | Redis, Redis Cluster or the master Redis Sentinel names, shared by every process using it |
//! | `postgres://…`, `postgresql://…` (`sslmode=require` and stricter need `tls`) | `postgres` | Postgres, shared and durable |
//!
//! A URL whose backend was not compiled in is refused with an error that
//! names the feature to enable.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let err = ratewarden::store::from_url("ftp://example.com").await.unwrap_err();
//! assert!(err.to_string().contains("unknown store scheme"));
//! # });
//! ```

use std::sync::Arc;

use ratewarden_core::url::Url;
use ratewarden_core::{ConfigError, Store};

/// `url` with every secret replaced by `***`, fit for errors, logs and
/// banners: the one redaction of the workspace,
/// [`ratewarden_core::url::redact`].
pub use ratewarden_core::url::redact;

// Each backend owns its schemes (`ratewarden_redis::URL_SCHEMES`, …); the
// router keeps its own copy so that a build without a backend can still
// recognise its URLs and name the feature to enable, and a test holds each
// copy equal to the backend's list when the backend is built.

/// The schemes of `memory://` URLs: the in-process store.
pub const MEMORY_SCHEMES: &[&str] = &["memory"];

/// The schemes of the Redis store (`ratewarden_redis::URL_SCHEMES`),
/// recognised with or without the `redis` feature.
pub const REDIS_SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "redis+unix",
    "unix",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
];

/// The schemes of the Postgres store (`ratewarden_postgres::URL_SCHEMES`),
/// recognised with or without the `postgres` feature.
pub const POSTGRES_SCHEMES: &[&str] = &["postgres", "postgresql"];

/// The key capacity of a `memory://` store without `?capacity=`.
pub use ratewarden_core::DEFAULT_KEY_CAPACITY as DEFAULT_MEMORY_CAPACITY;

/// Opens the store `url` names.
///
/// A malformed URL or an unknown scheme is an error here, at start-up.
/// Redis connects on its first decision, so a Redis that is down when the
/// application starts is handled like one that goes down later, by each
/// rule's failure policy. Postgres connects and migrates its schema here
/// (with its default options: see `ratewarden_postgres::PostgresStore` for a
/// builder with more), so an unreachable database is an error at start-up.
/// Errors show the URL redacted ([`redact`]).
pub async fn from_url(url: &str) -> Result<Arc<dyn Store>, ConfigError> {
    let invalid = |reason: String| ConfigError::InvalidUrl {
        url: redact(url),
        reason,
    };
    let expected = || {
        let all: Vec<&str> = [MEMORY_SCHEMES, REDIS_SCHEMES, POSTGRES_SCHEMES].concat();
        format!(
            "expected SCHEME://…, with one of the schemes {}",
            all.join(", ")
        )
    };
    let parsed =
        Url::parse(url).map_err(|e| invalid(format!("not a URL ({e}): {}", expected())))?;
    let scheme = parsed.scheme();
    if MEMORY_SCHEMES.contains(&scheme) {
        memory(&parsed).map_err(invalid)
    } else if REDIS_SCHEMES.contains(&scheme) {
        redis(url, scheme).await
    } else if POSTGRES_SCHEMES.contains(&scheme) {
        postgres(url, scheme).await
    } else {
        Err(invalid(format!(
            "unknown store scheme {scheme:?}: {}",
            expected()
        )))
    }
}

/// The capacity a `memory://` URL asks for.
fn memory_capacity(url: &Url) -> Result<usize, String> {
    let path = url.path();
    if url.has_host() || !url.username().is_empty() || !(path.is_empty() || path == "/") {
        return Err(
            // The rejected part is not echoed: it may hold user info, and
            // the redacted URL is shown beside this reason anyway.
            "a memory store has no user, host or path (use memory:// or memory://?capacity=N)"
                .to_string(),
        );
    }
    let mut capacity = DEFAULT_MEMORY_CAPACITY;
    for (name, value) in url.query_pairs() {
        match &*name {
            "capacity" => {
                capacity = value
                    .parse::<usize>()
                    .ok()
                    .filter(|c| *c > 0)
                    .ok_or_else(|| {
                        format!(
                            "capacity must be a positive whole number, got {}",
                            shown(&value)
                        )
                    })?;
            }
            other => {
                return Err(format!(
                    "unknown parameter {}; the only one is capacity=N",
                    shown(other)
                ));
            }
        }
    }
    Ok(capacity)
}

/// A query part as an error may show it: a plain word, or nothing. What a
/// malformed URL puts in its query may be anything, a password included
/// (the store_url fuzz target found one in a parameter name).
fn shown(part: &str) -> String {
    if !part.is_empty()
        && part.len() <= 32
        && part
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
    {
        format!("{part:?}")
    } else {
        "(not shown)".to_owned()
    }
}

#[cfg(feature = "memory")]
fn memory(url: &Url) -> Result<Arc<dyn Store>, String> {
    let capacity = memory_capacity(url)?;
    Ok(Arc::new(crate::memory::MemoryStore::new(capacity)))
}

#[cfg(not(feature = "memory"))]
fn memory(url: &Url) -> Result<Arc<dyn Store>, String> {
    memory_capacity(url)?;
    Err("memory:// needs the `memory` feature of the ratewarden crate".into())
}

#[allow(clippy::unused_async)]
async fn redis(url: &str, scheme: &str) -> Result<Arc<dyn Store>, ConfigError> {
    #[cfg(feature = "redis")]
    {
        let _ = scheme;
        let store = ratewarden_redis::RedisStore::from_url(url)?;
        Ok(Arc::new(store))
    }
    #[cfg(not(feature = "redis"))]
    {
        Err(ConfigError::InvalidUrl {
            url: redact(url),
            reason: format!("{scheme}:// needs the `redis` feature of the ratewarden crate"),
        })
    }
}

#[allow(clippy::unused_async)]
async fn postgres(url: &str, scheme: &str) -> Result<Arc<dyn Store>, ConfigError> {
    #[cfg(feature = "postgres")]
    {
        use ratewarden_postgres::{BuildError, PostgresStore};
        let _ = scheme;
        match PostgresStore::from_url(url).await {
            Ok(store) => Ok(Arc::new(store)),
            Err(BuildError::Config(e)) => Err(e),
            Err(e) => Err(ConfigError::InvalidUrl {
                url: redact(url),
                reason: e.to_string(),
            }),
        }
    }
    #[cfg(not(feature = "postgres"))]
    {
        Err(ConfigError::InvalidUrl {
            url: redact(url),
            reason: format!("{scheme}:// needs the `postgres` feature of the ratewarden crate"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The router's copies of the schemes are the backends' own lists.
    #[cfg(feature = "redis")]
    #[test]
    fn the_redis_schemes_are_the_redis_stores_own() {
        assert_eq!(REDIS_SCHEMES, ratewarden_redis::URL_SCHEMES);
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn the_postgres_schemes_are_the_postgres_stores_own() {
        assert_eq!(POSTGRES_SCHEMES, ratewarden_postgres::URL_SCHEMES);
    }

    fn capacity(url: &str) -> Result<usize, String> {
        memory_capacity(&Url::parse(url).unwrap())
    }

    #[test]
    fn memory_urls() {
        assert_eq!(capacity("memory://"), Ok(DEFAULT_MEMORY_CAPACITY));
        assert_eq!(capacity("memory://?capacity=10"), Ok(10));
        assert_eq!(capacity("memory:///?capacity=7&"), Ok(7));
        assert!(
            capacity("memory://?capacity=0")
                .unwrap_err()
                .contains("positive")
        );
        assert!(capacity("memory://?capacity=-1").is_err());
        assert!(
            capacity("memory://?size=3")
                .unwrap_err()
                .contains("unknown parameter")
        );
        assert!(
            capacity("memory://host")
                .unwrap_err()
                .contains("no user, host or path")
        );
        assert!(capacity("memory://user@host").is_err());
    }
}
