//! What every container fixture shares: one clean-up path and free ports.

use std::net::TcpListener;
use std::process::{Command, Stdio};

/// The label every fixture container carries: the value of
/// `LIMITER_TEST_RUN` (set by `scripts/test.sh` to one value per run), so
/// that a run can sweep what it started and nothing else on the machine.
pub const RUN_LABEL: &str = "limiter.test.run";

/// `request` labelled with this run ([`RUN_LABEL`]).
pub fn labelled(
    request: impl Into<testcontainers::ContainerRequest<testcontainers::GenericImage>>,
) -> testcontainers::ContainerRequest<testcontainers::GenericImage> {
    use testcontainers::ImageExt;
    let run = std::env::var("LIMITER_TEST_RUN").unwrap_or_else(|_| "none".into());
    request.into().with_label(RUN_LABEL, run)
}

/// Removes the container once this process is gone, even if it never drops
/// the handle (statics are not dropped at exit) or is killed. Every
/// container a fixture starts is registered here, so none outlives its test
/// process whichever way that ends.
pub fn reap_on_exit(id: &str) {
    let script = format!(
        "while kill -0 {} 2>/dev/null; do sleep 1; done; docker rm -f {} >/dev/null 2>&1",
        std::process::id(),
        id
    );
    // Detached and silent: a test runner waiting on our pipes must not wait
    // for the reaper too.
    let _ = Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

/// A port free on 127.0.0.1 now (and, for Redis Cluster nodes, its bus
/// port `port + 10000` too).
pub fn free_port(with_bus: bool) -> u16 {
    for _ in 0..1000 {
        let Ok(l) = TcpListener::bind("127.0.0.1:0") else {
            continue;
        };
        let Ok(addr) = l.local_addr() else { continue };
        let port = addr.port();
        if !with_bus {
            return port;
        }
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free port pair on 127.0.0.1");
}

/// The image named by the environment variable `var` (`name:tag`), or
/// `default`, as (name, tag).
pub fn image_from_env(var: &str, default: &str) -> (String, String) {
    let image = std::env::var(var).unwrap_or_else(|_| default.into());
    match image.rsplit_once(':') {
        Some((name, tag)) if !name.is_empty() && !tag.contains('/') => (name.into(), tag.into()),
        _ => (image, "latest".into()),
    }
}

/// A running container of a fixture, removed when dropped (and, whatever
/// happens, when its test process is gone).
pub type Container = testcontainers::ContainerAsync<testcontainers::GenericImage>;

/// Runs `start` once on a thread and runtime of its own (tests call this
/// from theirs, and connections belong to one runtime) and returns the URL
/// it gives; what it started is kept for the life of the process and
/// reaped after. Panics, naming `what`, if it fails.
pub fn start_shared<T, F, Fut>(what: &str, start: F) -> String
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = (T, String)>,
{
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime to start the container");
        let (started, url) = rt.block_on(start());
        std::mem::forget(started);
        url
    })
    .join()
    .unwrap_or_else(|_| panic!("starting {what} failed (see the message above)"))
}
