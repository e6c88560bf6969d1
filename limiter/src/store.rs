//! Opening a store from a URL, with the backends this build was compiled
//! with.
//!
//! | URL | Cargo feature | store |
//! |---|---|---|
//! | `memory://` or `memory://?capacity=N` | `memory` (default) | in-process, at most `N` keys (default [`DEFAULT_MEMORY_CAPACITY`]) |
//! | `redis://…`, `rediss://…`, `redis+cluster://…` | `redis` | Redis or Redis Cluster, shared by every process using it |
//! | `postgres://…`, `postgresql://…` | `postgres` | Postgres, shared and durable |
//!
//! A URL whose backend was not compiled in is refused with an error that
//! names the feature to enable.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let err = limiter::store::from_url("ftp://example.com").await.unwrap_err();
//! assert!(err.to_string().contains("unknown store scheme"));
//! # });
//! ```

use std::sync::Arc;

use limiter_core::{ConfigError, Store};

/// The key capacity of a `memory://` store without `?capacity=`.
pub const DEFAULT_MEMORY_CAPACITY: usize = 100_000;

/// Opens the store `url` names.
///
/// A malformed URL or an unknown scheme is an error here, at start-up.
/// Redis connects on its first decision, so a Redis that is down when the
/// application starts is handled like one that goes down later, by each
/// rule's failure policy. Postgres connects and migrates its schema here
/// (with its default options: see `limiter_postgres::PostgresStore` for a
/// builder with more), so an unreachable database is an error at start-up.
pub async fn from_url(url: &str) -> Result<Arc<dyn Store>, ConfigError> {
    let shown = redact(url);
    let invalid = |reason: String| ConfigError::InvalidUrl {
        url: shown.clone(),
        reason,
    };
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(invalid(
            "expected SCHEME://…, with scheme memory, redis, rediss, redis+cluster, postgres or postgresql"
                .into(),
        ));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "memory" => memory(rest).map_err(invalid),
        scheme @ ("redis" | "rediss" | "redis+cluster") => redis(url, scheme).await,
        scheme @ ("postgres" | "postgresql") => postgres(url, scheme).await,
        other => Err(invalid(format!(
            "unknown store scheme {other:?}: expected memory, redis, rediss, redis+cluster, postgres or postgresql"
        ))),
    }
}

/// Parses the part of a `memory://` URL after the scheme.
fn memory_capacity(rest: &str) -> Result<usize, String> {
    let (path, query) = match rest.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (rest, None),
    };
    if !path.is_empty() && path != "/" {
        return Err(
            // The rejected part is not echoed: it may hold user info, and
            // the redacted URL is shown beside this reason anyway.
            "a memory store has no user, host or path (use memory:// or memory://?capacity=N)"
                .to_string(),
        );
    }
    let mut capacity = DEFAULT_MEMORY_CAPACITY;
    for pair in query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter(|p| !p.is_empty())
    {
        match pair.split_once('=') {
            Some(("capacity", value)) => {
                capacity = value
                    .parse::<usize>()
                    .ok()
                    .filter(|c| *c > 0)
                    .ok_or_else(|| {
                        format!("capacity must be a positive whole number, got {value:?}")
                    })?;
            }
            _ => {
                return Err(format!(
                    "unknown parameter {pair:?}; the only one is capacity=N"
                ));
            }
        }
    }
    Ok(capacity)
}

#[cfg(feature = "memory")]
fn memory(rest: &str) -> Result<Arc<dyn Store>, String> {
    let capacity = memory_capacity(rest)?;
    Ok(Arc::new(crate::memory::MemoryStore::new(capacity)))
}

#[cfg(not(feature = "memory"))]
fn memory(rest: &str) -> Result<Arc<dyn Store>, String> {
    memory_capacity(rest)?;
    Err("memory:// needs the `memory` feature of the limiter crate".into())
}

#[allow(clippy::unused_async)]
async fn redis(url: &str, scheme: &str) -> Result<Arc<dyn Store>, ConfigError> {
    #[cfg(feature = "redis")]
    {
        let _ = scheme;
        let store = limiter_redis::RedisStore::from_url(url)?;
        Ok(Arc::new(store))
    }
    #[cfg(not(feature = "redis"))]
    {
        Err(ConfigError::InvalidUrl {
            url: redact(url),
            reason: format!("{scheme}:// needs the `redis` feature of the limiter crate"),
        })
    }
}

#[allow(clippy::unused_async)]
async fn postgres(url: &str, scheme: &str) -> Result<Arc<dyn Store>, ConfigError> {
    #[cfg(feature = "postgres")]
    {
        use limiter_postgres::{BuildError, PostgresStore};
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
            reason: format!("{scheme}:// needs the `postgres` feature of the limiter crate"),
        })
    }
}

/// `url` with any password replaced by `***`, fit for errors and logs.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_urls() {
        assert_eq!(memory_capacity(""), Ok(DEFAULT_MEMORY_CAPACITY));
        assert_eq!(memory_capacity("?capacity=10"), Ok(10));
        assert_eq!(memory_capacity("/?capacity=7&"), Ok(7));
        assert!(
            memory_capacity("?capacity=0")
                .unwrap_err()
                .contains("positive")
        );
        assert!(memory_capacity("?capacity=-1").is_err());
        assert!(
            memory_capacity("?size=3")
                .unwrap_err()
                .contains("unknown parameter")
        );
        assert!(
            memory_capacity("host")
                .unwrap_err()
                .contains("no user, host or path")
        );
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("postgres://app:hunter2@db:5432/limits?sslmode=require"),
            "postgres://app:***@db:5432/limits?sslmode=require"
        );
        assert_eq!(redact("redis://cache:6379/0"), "redis://cache:6379/0");
        assert_eq!(redact("redis://:p@ss@cache"), "redis://:***@cache");
    }
}
