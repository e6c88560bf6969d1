//! A PostgreSQL store for the limiter workspace: one statement per decision
