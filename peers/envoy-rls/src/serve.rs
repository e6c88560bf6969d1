//! One contender in a process of its own, so that its CPU time can be read
//! apart from the load generator's.

use std::net::SocketAddr;
use std::path::PathBuf;

use ratewarden_server::{Options, Server};

use crate::Contender;
use crate::limitador_rls::LimitadorRls;

pub async fn run(
    contender: Contender,
    store: &str,
    listen: SocketAddr,
    limit: u64,
) -> Result<(), String> {
    let redis = (store != "memory").then_some(store);
    match contender {
        Contender::Ratewarden => ratewarden(redis, listen, limit, None).await,
        Contender::RatewardenLeased => match redis {
            Some(_) => ratewarden(redis, listen, limit, Some(16)).await,
            None => Err("ratewarden-leased needs a redis:// store".into()),
        },
        Contender::Limitador | Contender::LimitadorCached => {
            // limitador-server's Prometheus exporter: its counters cost
            // what they cost there. ratewarden-server installs its own.
            metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .map_err(|e| format!("prometheus: {e}"))?;
            let cached = contender == Contender::LimitadorCached;
            let server = match redis {
                Some(url) => LimitadorRls::redis(limit, url, cached).await?,
                None if cached => {
                    return Err("limitador-cached needs a redis:// store".into());
                }
                None => LimitadorRls::new(limit),
            };
            server.serve(listen, terminated()).await
        }
    }
}

async fn ratewarden(
    redis: Option<&str>,
    listen: SocketAddr,
    limit: u64,
    lease: Option<u32>,
) -> Result<(), String> {
    let requests_per_unit = u32::try_from(limit).map_err(|_| "--limit must fit in u32")?;
    let config = config_file(requests_per_unit)?;
    let mut options = Options::new(&config);
    options.grpc = listen;
    // Nothing scrapes it here; a port of its own keeps two servers apart.
    options.http = "127.0.0.1:0".parse().expect("a valid address");
    options.store = Some(redis.unwrap_or("memory://").to_owned());
    options.lease = lease;
    let result = match Server::bind(options).await {
        Ok(server) => server.serve(terminated()).await,
        Err(e) => Err(e),
    };
    let _ = std::fs::remove_file(&config);
    result.map_err(|e| e.to_string())
}

/// envoyproxy/ratelimit's YAML for the one limit both contenders hold.
fn config_file(requests_per_unit: u32) -> Result<PathBuf, String> {
    let yaml = format!(
        "domain: bench\n\
         descriptors:\n  \
           - key: user\n    \
             rate_limit: {{ unit: hour, requests_per_unit: {requests_per_unit}, algorithm: fixed_window }}\n"
    );
    let path = std::env::temp_dir().join(format!("envoy-rls-bench-{}.yaml", std::process::id()));
    std::fs::write(&path, yaml).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// Ctrl-C, or the SIGTERM the comparison ends its children with.
async fn terminated() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
