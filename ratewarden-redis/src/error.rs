//! How `redis` crate errors become [`StoreError`]s: the kind decides whether
//! a [`Limiter`](ratewarden_core::Limiter) treats a failure as transient.

use ratewarden_core::{ErrorKind, StoreError};
use redis::RedisError;

use crate::NAME;

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
    StoreError::new(kind, NAME, e.to_string()).with_source(e)
}

/// A reply the store cannot read.
pub(crate) fn protocol(message: String) -> StoreError {
    StoreError::new(ErrorKind::Protocol, NAME, message)
}
