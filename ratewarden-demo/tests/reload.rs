//! The demo binary as an operator runs it: its limits file edited and
//! `SIGHUP` sent while it serves (the new limit applies, what was counted
//! stays counted, and a broken or emptied file leaves the limit and its
//! counts in force), and its log on stderr.
#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use http::StatusCode;
use ratewarden_test_support::http::TestClient;

/// The demo on a free port with `--config path`; its address, and its
/// output lines (stdout and stderr) as they come.
fn spawn_demo(path: &std::path::Path) -> (Child, String, mpsc::Receiver<String>) {
    spawn_demo_with(
        Command::new(env!("CARGO_BIN_EXE_ratewarden-demo"))
            .arg("--config")
            .arg(path),
    )
}

/// The demo `command` on a free port: its address, and its output lines
/// (stdout and stderr) as they come.
fn spawn_demo_with(command: &mut Command) -> (Child, String, mpsc::Receiver<String>) {
    let mut child = command
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the demo binary runs");
    let (tx, rx) = mpsc::channel();
    for out in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
    }
    let first = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the demo prints where it listens");
    let addr = first.rsplit("http://").next().unwrap().to_string();
    (child, addr, rx)
}

/// Sends SIGHUP to `child` and waits for the line saying how the reload
/// went.
fn hangup(child: &Child, lines: &mpsc::Receiver<String>) -> String {
    let status = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(60))
            .expect("the demo answers a hangup");
        if line.contains("reloaded") {
            return line;
        }
    }
}

#[tokio::test]
async fn sighup_applies_an_edited_file_keeping_usage_and_refuses_a_broken_one() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ratewarden-demo-reload");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("limits.toml");
    let limits = |policy: &str| format!("[limits.search]\npolicy = \"{policy}\"\n");
    std::fs::write(&path, limits("fixed_window 3/hour")).unwrap();
    let (child, addr, lines) = spawn_demo(&path);
    let child = Killed(child);
    let client = TestClient::new(addr.parse().unwrap(), None);

    for _ in 0..2 {
        assert_eq!(client.get("/api/search").await.status, StatusCode::OK);
    }
    // Raised to 5: the 2 counted stay counted.
    std::fs::write(&path, limits("fixed_window 5/hour")).unwrap();
    let said = hangup(&child.0, &lines);
    assert!(said.starts_with("limits reloaded from"), "{said}");
    let reply = client.get("/api/search").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.limit(), 5);
    assert_eq!(reply.remaining(), 2);

    // A broken file: refused, saying where, and 5 stays the limit.
    std::fs::write(&path, limits("fixed_window 9/hourz")).unwrap();
    let said = hangup(&child.0, &lines);
    assert!(
        said.starts_with("limits not reloaded, the old ones stay")
            && said.contains("line 2, column 10: `policy = \"fixed_window 9/hourz\"`"),
        "{said}"
    );
    let statuses: Vec<u16> = {
        let mut s = Vec::new();
        for _ in 0..3 {
            s.push(client.get("/api/search").await.status.as_u16());
        }
        s
    };
    assert_eq!(statuses, [200, 200, 429]);
    drop(child);
}

#[tokio::test]
async fn sighup_refuses_an_emptied_file_keeping_the_limit_and_its_count() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ratewarden-demo-reload-empty");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("limits.toml");
    // A sliding log: no window boundary for the wall clock to cross.
    let file = "[limits.search]\npolicy = \"3/hour\"\n";
    std::fs::write(&path, file).unwrap();
    let (child, addr, lines) = spawn_demo(&path);
    let child = Killed(child);
    let client = TestClient::new(addr.parse().unwrap(), None);
    let statuses = |n: usize| {
        let client = &client;
        async move {
            let mut s = Vec::new();
            for _ in 0..n {
                s.push(client.get("/api/search").await.status.as_u16());
            }
            s
        }
    };
    assert_eq!(statuses(4).await, [200, 200, 200, 429]);

    // `: > limits.toml`: refused, saying why, and the file's 3 stay spent.
    std::fs::write(&path, "").unwrap();
    let said = hangup(&child.0, &lines);
    assert!(
        said.starts_with("limits not reloaded, the old ones stay")
            && said.contains("limits.toml: no limit is defined"),
        "{said}"
    );
    let refused = client.get("/api/search").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.limit(), 3);

    // The file back: reloaded on the same counts.
    std::fs::write(&path, file).unwrap();
    let said = hangup(&child.0, &lines);
    assert!(said.starts_with("limits reloaded from"), "{said}");
    assert_eq!(statuses(1).await, [429]);
    drop(child);
}

/// The demo, stopped however the test ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

#[tokio::test]
async fn the_log_on_stderr_says_who_reset_which_client() {
    let token = "a token of sixteen bytes or more";
    let (child, addr, lines) = spawn_demo_with(
        Command::new(env!("CARGO_BIN_EXE_ratewarden-demo"))
            .env("RATEWARDEN_ADMIN_TOKEN", token)
            .env_remove("RUST_LOG"),
    );
    let child = Killed(child);
    let client = TestClient::new(addr.parse().unwrap(), None);
    let bearer = format!("Bearer {token}");
    let reply = client
        .send(
            http::Method::POST,
            "/admin/reset?client=192.0.2.1",
            &[("authorization", bearer.as_str())],
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let refused = client
        .send(http::Method::POST, "/admin/reset?client=192.0.2.1", &[])
        .await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    let mut said = Vec::new();
    while said.len() < 2 {
        let line = lines
            .recv_timeout(Duration::from_secs(60))
            .expect("the demo logs the resets");
        if line.contains("admin reset") {
            said.push(line);
        }
    }
    assert!(
        said[0].contains("INFO") && said[0].contains("routes=") && !said[0].contains(token),
        "{said:?}"
    );
    assert!(
        said[1].contains("WARN") && said[1].contains("refused"),
        "{said:?}"
    );
    drop(child);
}
