//! What every container fixture shares: one clean-up path and free ports.

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The label every fixture container carries: the value of
/// `RATEWARDEN_TEST_RUN` (set by `scripts/test.sh` to one value per run), so
/// that a run can sweep what it started and nothing else on the machine.
pub const RUN_LABEL: &str = "ratewarden.test.run";

/// `request` labelled with this run ([`RUN_LABEL`]).
pub fn labelled(
    request: impl Into<testcontainers::ContainerRequest<testcontainers::GenericImage>>,
) -> testcontainers::ContainerRequest<testcontainers::GenericImage> {
    use testcontainers::ImageExt;
    let run = std::env::var("RATEWARDEN_TEST_RUN").unwrap_or_else(|_| "none".into());
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

/// `name:tag` as (name, tag); no tag is `latest`.
fn split_image(image: &str) -> (String, String) {
    match image.rsplit_once(':') {
        Some((name, tag)) if !name.is_empty() && !tag.contains('/') => (name.into(), tag.into()),
        _ => (image.into(), "latest".into()),
    }
}

/// The image a fixture runs, as (name, tag): the one the environment
/// variable `var` names; else the locally built test image `local` if this
/// machine has it (`scripts/build-test-images.sh` builds it where no
/// registry is reachable); else the official image `official`, which
/// Docker pulls on first use.
pub fn image_from_env(var: &str, local: &str, official: &str) -> (String, String) {
    if let Ok(image) = std::env::var(var) {
        return split_image(&image);
    }
    let present = Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", local])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    split_image(if present { local } else { official })
}

/// The payload a fixture unwinds with after [`fail`] printed its message.
#[derive(Debug)]
pub struct FixtureFailed(pub String);

/// Fails the calling test with `message` alone: one line on stderr, without
/// the panic report and backtrace hint (the panic hook is not run), so that
/// a machine without Docker shows what is missing and how to fix it, once
/// per container test.
pub fn fail(message: &str) -> ! {
    eprintln!("{message}");
    std::panic::resume_unwind(Box::new(FixtureFailed(message.to_owned())))
}

/// Fails the calling test with one line if Docker cannot start containers;
/// `url_var` names the variable that points the shared-server tests at a
/// running server instead. Asked once per process.
pub fn require_docker(what: &str, url_var: &str) {
    static STATUS: OnceLock<Result<(), String>> = OnceLock::new();
    let status = STATUS.get_or_init(|| {
        let out = Command::new("docker")
            .args(["info", "--format", "{{.ServerVersion}}"])
            .stdin(Stdio::null())
            .output();
        match out {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err("the `docker` command is not installed".into())
            }
            Err(e) => Err(format!("`docker info` could not run ({e})")),
            Ok(out) if !out.status.success() => {
                let stderr = String::from_utf8_lossy(&out.stderr);
                let reason = stderr.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
                Err(format!(
                    "the Docker engine is not reachable ({})",
                    reason.trim()
                ))
            }
            Ok(_) => Ok(()),
        }
    });
    if let Err(missing) = status {
        fail(&format!(
            "{what} needs Docker, and {missing}: start the Docker engine (scripts/test.sh \
             then builds the test images), or set {url_var} to a running server for the tests \
             that need no container of their own"
        ));
    }
}

/// A running container of a fixture, removed when dropped (and, whatever
/// happens, when its test process is gone).
pub type Container = testcontainers::ContainerAsync<testcontainers::GenericImage>;

/// Runs `start` once on a thread and runtime of its own (tests call this
/// from theirs, and connections belong to one runtime) and returns the URL
/// it gives; what it started is kept for the life of the process and
/// reaped after. Fails the test, naming `what`, if it fails.
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
    .unwrap_or_else(|payload| match payload.downcast::<FixtureFailed>() {
        // Already printed by `fail` on the starting thread.
        Ok(failed) => std::panic::resume_unwind(failed),
        Err(_) => fail(&format!("starting {what} failed (see the message above)")),
    })
}

/// A server the fixtures run in containers: its images, and the variables
/// that name another image or a running server instead. Redis and
/// PostgreSQL each have one, so both say the same things the same way.
#[derive(Debug)]
pub struct Server {
    /// The server's name in messages ("Redis").
    pub what: &'static str,
    /// The variable naming another image (`name:tag`).
    pub image_var: &'static str,
    /// The variable naming a running server for the shared-server tests.
    pub url_var: &'static str,
    /// The locally built test image.
    pub local: &'static str,
    /// The official image, run where the local one was not built.
    pub official: &'static str,
}

impl Server {
    /// The image to run, as (name, tag): see [`image_from_env`].
    pub fn image(&self) -> (String, String) {
        image_from_env(self.image_var, self.local, self.official)
    }

    /// Fails the calling test with one line unless Docker can start
    /// containers.
    pub fn require_docker(&self, test: &str) {
        require_docker(test, self.url_var);
    }

    /// What to do when a container of `image` does not start, on one line.
    pub fn image_help(&self, (name, tag): &(String, String)) -> String {
        format!(
            "is {name}:{tag} available? Run scripts/build-test-images.sh (it pulls {} or builds \
             {} from Debian's packages), or set {} to a {} image this machine has (tests that \
             need no container of their own also take {})",
            self.official, self.local, self.image_var, self.what, self.url_var
        )
    }

    /// Starts `request` (a container of `image`), registering it for removal
    /// at exit; fails the test with one line saying what to do if it
    /// cannot start.
    pub async fn start(
        &self,
        request: impl Into<testcontainers::ContainerRequest<testcontainers::GenericImage>>,
        image: &(String, String),
        what: &str,
    ) -> Container {
        use testcontainers::runners::AsyncRunner;
        self.require_docker(&format!("this {what} test"));
        let container = match labelled(request).start().await {
            Ok(container) => container,
            Err(e) => fail(&format!(
                "cannot start a {what} container ({e}): {}",
                self.image_help(image)
            )),
        };
        reap_on_exit(container.id());
        container
    }
}
