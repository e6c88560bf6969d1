//! Asks a rate-limit service `ShouldRateLimit` once per line of output, as
//! Envoy would: a smoke test from a shell, without grpcurl.
//!
//! ```text
//! cargo run -p ratewarden-server --example ask -- edge remote_address=10.0.0.1
//! cargo run -p ratewarden-server --example ask -- edge path=/login remote_address=10.0.0.1 --times 6
//! cargo run -p ratewarden-server --example ask -- --addr http://127.0.0.1:8081 --hits 5 edge user=u1
//! ```
//!
//! Every `key=value` argument is one entry of one descriptor.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut addr = "http://127.0.0.1:8081".to_owned();
    let (mut times, mut hits, mut words) = (1, 0, Vec::new());
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--addr" => addr = args.next().ok_or("--addr needs a URL")?,
            "--times" => times = args.next().ok_or("--times needs a number")?.parse()?,
            "--hits" => hits = args.next().ok_or("--hits needs a number")?.parse()?,
            _ => words.push(arg),
        }
    }
    let Some((domain, entries)) = words.split_first() else {
        return Err("usage: ask [--addr URL] [--times N] [--hits N] DOMAIN KEY=VALUE...".into());
    };
    let entries = entries
        .iter()
        .map(|e| {
            let (key, value) = e.split_once('=').ok_or("an entry is KEY=VALUE")?;
            Ok(Entry {
                key: key.into(),
                value: value.into(),
            })
        })
        .collect::<Result<Vec<_>, &str>>()?;
    let mut client = RateLimitServiceClient::connect(addr).await?;
    for _ in 0..times {
        let request = RateLimitRequest {
            domain: domain.clone(),
            descriptors: vec![RateLimitDescriptor {
                entries: entries.clone(),
                ..RateLimitDescriptor::default()
            }],
            hits_addend: hits,
        };
        let response = client.should_rate_limit(request).await?.into_inner();
        let code = Code::try_from(response.overall_code).unwrap_or(Code::Unknown);
        let status = &response.statuses[0];
        let headers: Vec<String> = response
            .response_headers_to_add
            .iter()
            .map(|h| format!("{}: {}", h.key, h.value))
            .collect();
        println!(
            "{} remaining={} {}",
            code.as_str_name(),
            status.limit_remaining,
            headers.join(" | ")
        );
    }
    Ok(())
}
