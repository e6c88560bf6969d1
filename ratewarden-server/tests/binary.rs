//! The binary as an operator runs it: flags, SIGHUP, SIGTERM.

use std::process::{Command, Stdio};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratewarden_test_support::containers::free_port;

fn yaml(limit: u32) -> String {
    format!(
        "domain: bin\ndescriptors:\n  - key: user\n    rate_limit: {{ unit: hour, requests_per_unit: {limit} }}\n"
    )
}

struct KillOnDrop(Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn kill(signal: &str, pid: u32) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn the_binary_serves_reloads_on_sighup_and_stops_on_sigterm() {
    let config =
        std::env::temp_dir().join(format!("ratewarden-server-bin-{}.yaml", std::process::id()));
    std::fs::write(&config, yaml(2)).unwrap();
    let (grpc, http) = (free_port(false), free_port(false));
    let child = Command::new(env!("CARGO_BIN_EXE_ratewarden-server"))
        .arg("--config")
        .arg(&config)
        .args(["--listen", &format!("127.0.0.1:{grpc}")])
        .env("RATEWARDEN_HTTP", format!("127.0.0.1:{http}"))
        .env("RATEWARDEN_WATCH_MS", "0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Killed if the test fails before it stops the server itself.
    let pid = child.id();
    let mut guard = KillOnDrop(Some(child));
    let mut client = None;
    for _ in 0..200 {
        if let Ok(c) = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}")).await {
            client = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut client = client.expect("the server listens");
    let request = || RateLimitRequest {
        domain: "bin".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: "u".into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    };
    let mut code = async || {
        client
            .should_rate_limit(request())
            .await
            .unwrap()
            .into_inner()
            .overall_code
    };
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!([code().await, code().await, code().await], [ok, ok, over]);

    // Raised to 3 and reloaded by SIGHUP (the watcher is off): one more.
    std::fs::write(&config, yaml(3)).unwrap();
    kill("-HUP", pid);
    let mut reloaded = false;
    for _ in 0..200 {
        if code().await == ok {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(reloaded, "SIGHUP reloaded the file");
    assert_eq!(
        code().await,
        over,
        "the two spent before the reload still count"
    );

    kill("-TERM", pid);
    let child = guard.0.take().unwrap();
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{log}");
    assert!(log.contains("configuration reloaded"), "{log}");
    assert!(log.contains("shutting down"), "{log}");
}
