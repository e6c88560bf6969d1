//! Rate limiting with pluggable stores, tower middleware and client identity
