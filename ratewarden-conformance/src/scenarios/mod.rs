//! The scenarios, one module per theme. Each function takes a factory,
//! makes its own fresh stores, and may assume it does not panic: the public
//! wrappers generated at the crate root turn a panicking store into a
//! failure.

pub(crate) mod concurrency;
pub(crate) mod configuration;
pub(crate) mod flood;
pub(crate) mod keys;
pub(crate) mod operations;
pub(crate) mod refund;
pub(crate) mod semantics;
pub(crate) mod time;
