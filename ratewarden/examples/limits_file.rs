//! The README's limits-file snippet: limits and per-route limits from a
//! TOML file, an axum app built from them, and a reload that applies an
//! edited file without a restart.
//!
//! Run with `cargo run -p ratewarden --features memory,axum,config --example limits_file`.

use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use ratewarden::config::{Limits, Reloader};
use ratewarden::{ClientIdentity, ConfigError, RateLimitLayer};

/// The app the limits describe: each route limited by its limit.
fn app(limits: &Limits, identity: &ClientIdentity) -> Result<Router, ConfigError> {
    let mut router = Router::new();
    for (route, limiter) in limits.routes() {
        let layer = RateLimitLayer::new(limiter.clone(), identity.clone())?;
        router = router.route(route, get(|| async { "ok" }).route_layer(layer));
    }
    Ok(router)
}

// Unformatted: the README quotes these lines as they are.
#[rustfmt::skip]
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join("ratewarden-limits-example.toml");
    std::fs::write(&path, "[stores]\ndefault = \"memory://\"\n\n[limits.search]\npolicy = \"60/minute\"\n\n[routes]\n\"/api/search\" = \"search\"\n")?;
    let identity = ClientIdentity::random()?;

    let limits = Limits::from_file(&path).await?;
    let (reloader, service) = Reloader::new(limits, move |limits: &Limits| app(limits, &identity))?;
    reloader.clone().reload_on_sighup()?; // or reloader.reload().await? from an admin route
    let app = Router::new().fallback_service(service);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("serving on http://{}; kill -HUP {} reloads {}", listener.local_addr()?, std::process::id(), path.display());
    std::fs::write(&path, std::fs::read_to_string(&path)?.replace("60/minute", "120/minute"))?;
    reloader.reload().await?;
    println!("search: {}", reloader.limits().await.route("/api/search").map_or(0, |l| l.rules()[0].policy().limit()));
    drop((listener, app.into_make_service_with_connect_info::<SocketAddr>()));
    Ok(())
}
