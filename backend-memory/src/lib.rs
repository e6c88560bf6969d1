//! A bounded, sharded, in-process store for the limiter workspace
