//! `ShouldRateLimit`: each descriptor decided by its node's limiter.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use futures::future::join_all;
use http::HeaderMap;
use http::header::RETRY_AFTER;
use ratewarden::{ConfigError, Decision};
use tonic::{Request, Response, Status};

use crate::config::{Domains, Limit};

/// The most descriptors one request may carry: Envoy sends one per
/// `rate_limits` action of a route, a handful.
pub const MAX_DESCRIPTORS: usize = 64;

/// The most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 32;

/// The most bytes of entry values in one descriptor: the client's key.
pub const MAX_KEY_BYTES: usize = 4096;

/// Envoy's `RateLimitService` on ratewarden's limiters, built from a
/// [`Domains`] that [`replace`](Self::replace) swaps while requests run.
///
/// Clones share the domains.
#[derive(Debug, Clone)]
pub struct RateLimitServer {
    domains: Arc<ArcSwap<Domains>>,
}

/// One descriptor's answer.
struct Outcome {
    status: DescriptorStatus,
    /// The limit and decision behind the status, for the headers.
    decided: Option<(Arc<Limit>, Decision)>,
}

impl RateLimitServer {
    /// A server answering from `domains`.
    pub fn new(domains: Domains) -> Self {
        RateLimitServer {
            domains: Arc::new(ArcSwap::from_pointee(domains)),
        }
    }

    /// Answers from `domains` from now on; requests in flight finish on the
    /// domains they started with.
    pub fn replace(&self, domains: Domains) {
        self.domains.store(Arc::new(domains));
    }

    /// The domains in force.
    pub fn domains(&self) -> Arc<Domains> {
        self.domains.load_full()
    }

    /// Decides `request` as `ShouldRateLimit` does, without gRPC around it.
    pub async fn decide(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        if request.domain.is_empty() {
            return Err(Status::invalid_argument("`domain` must not be empty"));
        }
        if request.descriptors.is_empty() {
            return Err(Status::invalid_argument("`descriptors` must not be empty"));
        }
        if request.descriptors.len() > MAX_DESCRIPTORS {
            return Err(Status::invalid_argument(format!(
                "at most {MAX_DESCRIPTORS} descriptors per request, got {}",
                request.descriptors.len()
            )));
        }
        for d in &request.descriptors {
            check_descriptor(d)?;
        }
        let domains = self.domains.load_full();
        let outcomes = join_all(
            request
                .descriptors
                .iter()
                .map(|d| decide_one(&domains, &request.domain, d, request.hits_addend)),
        )
        .await;
        let over = outcomes
            .iter()
            .any(|o| o.status.code == Code::OverLimit as i32);
        let response_headers_to_add = Self::headers(&outcomes);
        match domains.requests(&request.domain, over) {
            Some(counter) => counter.increment(1),
            None => metrics::counter!(
                "ratewarden_server_requests_total",
                "domain" => request.domain.clone(),
                "code" => if over { "over_limit" } else { "ok" },
            )
            .increment(1),
        }
        Ok(RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses: outcomes.into_iter().map(|o| o.status).collect(),
            response_headers_to_add,
            ..RateLimitResponse::default()
        })
    }

    /// The headers of the most restrictive descriptor: the first that
    /// refused, or the admitting one with the least remaining.
    fn headers(outcomes: &[Outcome]) -> Vec<HeaderValue> {
        let chosen = outcomes
            .iter()
            .filter_map(|o| o.decided.as_ref())
            .min_by_key(|(_, d)| (d.allowed, d.remaining));
        let Some((limit, decision)) = chosen else {
            return Vec::new();
        };
        let mut map = HeaderMap::new();
        limit.headers.write(decision, &mut map);
        // No wait admits a cost above the limit: no Retry-After then.
        if !decision.allowed && !decision.retry_after.is_zero() {
            map.insert(RETRY_AFTER, decision.retry_after_secs().into());
        }
        map.iter()
            .filter_map(|(name, value)| {
                Some(HeaderValue {
                    key: name.as_str().to_owned(),
                    value: value.to_str().ok()?.to_owned(),
                    ..HeaderValue::default()
                })
            })
            .collect()
    }
}

fn check_descriptor(d: &RateLimitDescriptor) -> Result<(), Status> {
    if d.entries.is_empty() {
        return Err(Status::invalid_argument("a descriptor has no entries"));
    }
    if d.entries.len() > MAX_ENTRIES {
        return Err(Status::invalid_argument(format!(
            "at most {MAX_ENTRIES} entries per descriptor, got {}",
            d.entries.len()
        )));
    }
    let bytes: usize = d.entries.iter().map(|e| e.key.len() + e.value.len()).sum();
    if bytes > MAX_KEY_BYTES {
        return Err(Status::invalid_argument(format!(
            "a descriptor's keys and values are {bytes} bytes, more than {MAX_KEY_BYTES}"
        )));
    }
    if d.limit.is_some() {
        return Err(Status::invalid_argument(
            "a descriptor's `limit` override is not supported: put the limit in the \
             service's configuration file",
        ));
    }
    if d.is_negative_hits {
        return Err(Status::invalid_argument(
            "`is_negative_hits` (giving units back) is not supported",
        ));
    }
    Ok(())
}

async fn decide_one(
    domains: &Domains,
    domain: &str,
    d: &RateLimitDescriptor,
    request_hits: u32,
) -> Outcome {
    let unlimited = Outcome {
        status: DescriptorStatus {
            code: Code::Ok as i32,
            ..DescriptorStatus::default()
        },
        decided: None,
    };
    let entries = d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str()));
    let Some(limit) = domains.find(domain, entries) else {
        return unlimited;
    };
    // Envoy's request-level `hits_addend` is 0 when unset, which means 1;
    // a descriptor's own is set on purpose, and 0 asks for the status
    // without spending anything.
    let cost = match &d.hits_addend {
        Some(v) => v.value,
        None => u64::from(request_hits.max(1)),
    };
    let key = client_key(limit.scope.as_deref(), d);
    let mut decision = match u32::try_from(cost) {
        Ok(0) => limit.limiter.peek(&key).await,
        Ok(cost) => match limit.limiter.check_cost(&key, cost).await {
            Ok(decision) => decision,
            Err(ConfigError::InvalidCost { .. }) => never(limit, &key).await,
            Err(e) => {
                tracing::warn!(rule = %limit.rule, "unexpected error: {e}");
                never(limit, &key).await
            }
        },
        Err(_) => never(limit, &key).await,
    };
    // A named limit's rules are the limits file's: shadow mode set on the
    // node is applied here (a refusal is recorded by no rule either way).
    if limit.shadow && !decision.allowed {
        decision.allowed = true;
        decision.retry_after = Duration::ZERO;
        decision.source.shadow_refused = true;
    }
    let code = if decision.allowed {
        Code::Ok
    } else {
        Code::OverLimit
    };
    let label = if decision.source.shadow_refused {
        "shadow_over_limit"
    } else if decision.allowed {
        "ok"
    } else {
        "over_limit"
    };
    if limit.detailed_metric {
        let descriptor = d
            .entries
            .iter()
            .map(|e| format!("{}_{}", e.key, e.value))
            .collect::<Vec<_>>()
            .join(".");
        metrics::counter!(
            "ratewarden_server_descriptors_total",
            "domain" => domain.to_owned(),
            "descriptor" => descriptor,
            "code" => label,
        )
        .increment(1);
    } else {
        let counters = &limit.counters;
        match label {
            "ok" => &counters.ok,
            "over_limit" => &counters.over_limit,
            _ => &counters.shadow_over_limit,
        }
        .increment(1);
    }
    Outcome {
        status: DescriptorStatus {
            code: code as i32,
            current_limit: Some(RateLimit {
                name: limit.name.clone(),
                requests_per_unit: limit.requests_per_unit,
                unit: limit.unit,
            }),
            limit_remaining: decision.remaining,
            duration_until_reset: Some(pb_duration(decision.reset_after)),
            ..DescriptorStatus::default()
        },
        decided: Some((limit.clone(), decision)),
    }
}

/// The answer to a cost no window can ever admit (above the limit, or
/// beyond `u32`): refused, with the key's quota as it stands.
async fn never(limit: &Limit, key: &[u8]) -> Decision {
    let mut decision = limit.limiter.peek(key).await;
    decision.allowed = false;
    decision
}

/// The client a descriptor names: its entries' values, each escaped so
/// that no two lists of values give one key (`a,b` + `c` against `a` +
/// `b,c`). Entry keys are the node's, so the values alone tell clients
/// apart; keeping the keys makes the store's keys readable. A named
/// limit's keys lead with the node's path.
fn client_key(scope: Option<&str>, d: &RateLimitDescriptor) -> Vec<u8> {
    let mut key = Vec::with_capacity(64);
    if let Some(scope) = scope {
        // The path comes from the configuration, not the request: a client
        // chooses values only, after it.
        key.extend_from_slice(scope.as_bytes());
        key.push(b'|');
    }
    for (i, e) in d.entries.iter().enumerate() {
        if i > 0 {
            key.push(b',');
        }
        key.extend_from_slice(e.key.as_bytes());
        key.push(b'=');
        for &b in e.value.as_bytes() {
            if b == b',' || b == b'\\' {
                key.push(b'\\');
            }
            key.push(b);
        }
    }
    key
}

fn pb_duration(d: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

#[tonic::async_trait]
impl RateLimitService for RateLimitServer {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.decide(request.get_ref()).await.map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

    fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect(),
            ..RateLimitDescriptor::default()
        }
    }

    #[test]
    fn client_keys_do_not_collide_across_value_boundaries() {
        let a = client_key(None, &descriptor(&[("x", "a,y=b"), ("y", "c")]));
        let b = client_key(None, &descriptor(&[("x", "a"), ("y", "b,y=c")]));
        assert_ne!(a, b);
        assert_eq!(
            client_key(None, &descriptor(&[("remote_address", "10.0.0.1")])),
            b"remote_address=10.0.0.1"
        );
    }
}
