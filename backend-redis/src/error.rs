//! How `redis` crate errors become [`StoreError`]s: the kind decides whether
//! a [`Limiter`](limiter_core::Limiter) treats a failure as transient.

use limiter_core::{ErrorKind, StoreError};
use redis::RedisError;

use crate::STORE_NAME;

pub(crate) fn store_error(e: RedisError) -> StoreError {
    use redis::ServerErrorKind as S;
    let kind = if e.is_timeout() {
        ErrorKind::Timeout
    } else if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
        || matches!(
            e.kind(),
            redis::ErrorKind::ClusterConnectionNotFound
                | redis::ErrorKind::Server(
                    S::BusyLoading | S::TryAgain | S::ClusterDown | S::MasterDown | S::ReadOnly
                )
        )
    {
        ErrorKind::Unavailable
    } else {
        ErrorKind::Protocol
    };
    StoreError::new(kind, STORE_NAME, e.to_string()).with_source(e)
}

#[cfg(feature = "deadpool")]
pub(crate) fn pool_error(e: deadpool_redis::PoolError) -> RedisError {
    match e {
        deadpool_redis::PoolError::Backend(e) => e,
        other => RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            other.to_string(),
        )),
    }
}

/// A reply the store cannot read.
pub(crate) fn protocol(message: String) -> StoreError {
    StoreError::new(ErrorKind::Protocol, STORE_NAME, message)
}
