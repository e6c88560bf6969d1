//! The peer: Envoy's `RateLimitService` on the `limitador` crate, shaped
//! like limitador-server's handler so that it costs what that one costs.

use std::collections::HashMap;
use std::net::SocketAddr;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use limitador::limit::{Context, Expression, Limit, Namespace, Predicate};
use limitador::storage::redis::{AsyncRedisStorage, CachedRedisStorage};
use limitador::{AsyncRateLimiter, RateLimiter};
use tonic::{Request, Response, Status};

/// limitador's in-memory storage, or its Redis storages: exact
/// (`AsyncRedisStorage`, a round trip per decision) or cached
/// (`CachedRedisStorage`, counters flushed to Redis in batches, which
/// limitador documents as able to go over the limit).
pub struct LimitadorRls {
    limiter: Limiter,
}

enum Limiter {
    Memory(RateLimiter),
    Redis(AsyncRateLimiter),
}

/// The limit the benchmark's descriptors meet: `max` per hour in namespace
/// (Envoy domain) `bench`, one counter per value of the first descriptor's
/// `user` entry.
fn bench_limit(max: u64) -> Limit {
    let variable = Expression::parse("descriptors[0].user").expect("a valid CEL expression");
    Limit::new("bench", max, 3600, Vec::<Predicate>::new(), [variable])
}

impl LimitadorRls {
    pub fn new(max: u64) -> Self {
        // limitador-server sizes this cache from free memory; any size
        // above the benchmark's keys behaves the same.
        let limiter = RateLimiter::new(100_000);
        limiter.add_limit(bench_limit(max));
        LimitadorRls {
            limiter: Limiter::Memory(limiter),
        }
    }

    /// On the Redis at `url`; `cached` for limitador's cached mode.
    pub async fn redis(max: u64, url: &str, cached: bool) -> Result<Self, String> {
        let storage: Box<dyn limitador::storage::AsyncCounterStorage> = if cached {
            Box::new(
                CachedRedisStorage::new(url)
                    .await
                    .map_err(|e| format!("redis: {e}"))?,
            )
        } else {
            Box::new(
                AsyncRedisStorage::new(url)
                    .await
                    .map_err(|e| format!("redis: {e}"))?,
            )
        };
        let limiter = AsyncRateLimiter::new_with_storage(storage);
        limiter.add_limit(bench_limit(max));
        Ok(LimitadorRls {
            limiter: Limiter::Redis(limiter),
        })
    }

    pub async fn serve(
        self,
        listen: SocketAddr,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), String> {
        tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(self))
            .serve_with_shutdown(listen, shutdown)
            .await
            .map_err(|e| format!("gRPC on {listen}: {e}"))
    }
}

#[tonic::async_trait]
impl RateLimitService for LimitadorRls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        if request.domain.is_empty() {
            return Ok(Response::new(RateLimitResponse {
                overall_code: Code::Unknown as i32,
                ..RateLimitResponse::default()
            }));
        }
        let namespace = Namespace::from(request.domain);
        // CEL sees the request as `descriptors`, a list of maps from entry
        // key to value, which limits index (`descriptors[0].user`).
        let descriptors: Vec<HashMap<String, String>> = request
            .descriptors
            .iter()
            .map(|d| {
                d.entries
                    .iter()
                    .map(|e| (e.key.clone(), e.value.clone()))
                    .collect()
            })
            .collect();
        let count = descriptors.len();
        let mut ctx = Context::default();
        ctx.list_binding("descriptors".to_owned(), descriptors);
        // Envoy leaves `hits_addend` at 0 for one hit.
        let hits = u64::from(request.hits_addend.max(1));

        // limitador-server calls the in-memory limiter on the runtime's
        // worker, as here: it does not block on I/O.
        let result = match &self.limiter {
            Limiter::Memory(l) => l.check_rate_limited_and_update(&namespace, &ctx, hits),
            Limiter::Redis(l) => {
                l.check_rate_limited_and_update(&namespace, &ctx, hits)
                    .await
            }
        }
        // Unavailable, not Unknown: Envoy lets Unknown through whatever its
        // `failure_mode_deny` says.
        .map_err(|e| Status::unavailable(format!("storage: {e}")))?;

        let labels = [("limitador_namespace", namespace.as_ref().to_owned())];
        let code = if result.limited {
            metrics::counter!("limited_calls", &labels).increment(1);
            Code::OverLimit
        } else {
            metrics::counter!("authorized_calls", &labels).increment(1);
            metrics::counter!("authorized_hits", &labels).increment(hits);
            Code::Ok
        };
        // limitador answers for the request as a whole; the only limit
        // reads the first descriptor, so that one carries the refusal.
        let statuses = (0..count)
            .map(|i| DescriptorStatus {
                code: if i == 0 { code } else { Code::Ok } as i32,
                ..DescriptorStatus::default()
            })
            .collect();
        Ok(Response::new(RateLimitResponse {
            overall_code: code as i32,
            statuses,
            ..RateLimitResponse::default()
        }))
    }
}
