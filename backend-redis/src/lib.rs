//! A Redis store for the limiter workspace: one script call per decision
