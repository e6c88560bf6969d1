//! Demo server: three rate-limited endpoints on the limiter crate.

fn main() {}
