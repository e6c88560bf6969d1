//! Without Docker, a container test fails with one line that says what is
//! missing and how to fix it: no panic report, no backtrace hint. Each
//! fixture is run in a child process of this test binary whose
//! `DOCKER_HOST` points at a socket nothing listens on.

use std::process::Command;

use ratewarden_test_support::{postgres, redis};

/// Set in the child processes, which run the ignored fixtures below.
const CHILD: &str = "RATEWARDEN_NO_DOCKER_CHILD";

/// Runs the ignored test `name` of this binary with no Docker engine and
/// no server to point at; returns what it printed.
fn run_without_docker(name: &str) -> (bool, String) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            name,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            "DOCKER_HOST",
            "unix:///nonexistent/ratewarden-no-docker.sock",
        )
        .env(CHILD, "1")
        .env_remove("RATEWARDEN_REDIS_URL")
        .env_remove("RATEWARDEN_POSTGRES_URL")
        .env_remove("RATEWARDEN_REDIS_IMAGE")
        .env_remove("RATEWARDEN_POSTGRES_IMAGE")
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    let printed =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), printed)
}

#[test]
fn container_fixtures_fail_with_one_line_without_docker() {
    for (name, url_var) in [
        ("child_shared_redis", "RATEWARDEN_REDIS_URL"),
        ("child_private_redis", "RATEWARDEN_REDIS_URL"),
        ("child_shared_postgres", "RATEWARDEN_POSTGRES_URL"),
    ] {
        let (passed, printed) = run_without_docker(name);
        assert!(!passed, "{name} passed without Docker:\n{printed}");
        let lines: Vec<&str> = printed
            .lines()
            .filter(|l| l.contains("needs Docker"))
            .collect();
        assert_eq!(lines.len(), 1, "{name}: one line expected:\n{printed}");
        assert!(
            lines[0].contains("not reachable") && lines[0].contains(url_var),
            "{name}: the line names neither the cause nor the fix: {}",
            lines[0]
        );
        assert!(
            !printed.contains("panicked at") && !printed.contains("RUST_BACKTRACE"),
            "{name}: a panic report instead of one line:\n{printed}"
        );
        assert!(
            printed.contains(&format!("test {name} ... FAILED")),
            "{name} did not run:\n{printed}"
        );
    }
}

#[test]
#[ignore = "run by container_fixtures_fail_with_one_line_without_docker, without Docker"]
fn child_shared_redis() {
    assert!(std::env::var_os(CHILD).is_some(), "run only as a child");
    redis::shared_url();
}

#[tokio::test]
#[ignore = "run by container_fixtures_fail_with_one_line_without_docker, without Docker"]
async fn child_private_redis() {
    assert!(std::env::var_os(CHILD).is_some(), "run only as a child");
    redis::start_redis().await;
}

#[test]
#[ignore = "run by container_fixtures_fail_with_one_line_without_docker, without Docker"]
fn child_shared_postgres() {
    assert!(std::env::var_os(CHILD).is_some(), "run only as a child");
    postgres::server_url();
}
