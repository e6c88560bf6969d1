//! A process's threads as Linux names them, for tests that check a
//! background thread was started.

/// The names of this process's threads (`/proc/self/task/*/comm`, at most
/// 15 bytes each). Empty where there is no `/proc` (not Linux).
pub fn thread_names() -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_owned())
        .collect()
}

/// Whether this process has a thread named `name`, waiting up to 10 s for
/// it: a spawned thread names itself once it runs, so a thread spawned just
/// now may not be named yet.
pub fn has_thread(name: &str) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if thread_names().iter().any(|n| n == name) {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_named_thread_is_listed() {
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let spawned = std::thread::Builder::new()
            .name("named-by-test".into())
            .spawn(move || {
                let _ = wait.recv();
            })
            .unwrap();
        if cfg!(target_os = "linux") {
            assert!(super::has_thread("named-by-test"));
            assert!(!super::thread_names().iter().any(|n| n == "never-spawned"));
        }
        drop(done);
        spawned.join().unwrap();
    }
}
