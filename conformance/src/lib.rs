//! Adversarial conformance scenarios that any limiter store must pass
