//! A process's memory as Linux reports it, for benches that check memory
//! stays flat.

/// A `kB` field of `/proc/<process>/status` (`VmRSS:`, `VmHWM:`), in KiB;
/// `process` is a pid or `self`. Zero where the file or the field is
/// missing (not Linux).
pub fn status_kib(process: &str, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{process}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_has_a_resident_set() {
        if cfg!(target_os = "linux") {
            assert!(super::status_kib("self", "VmRSS:") > 0);
        }
        assert_eq!(super::status_kib("self", "NoSuchField:"), 0);
    }
}
