//! The routes' policies from a TOML file (`ratewarden-demo --config
//! limits.toml`).
//!
//! ```toml
//! [routes.search]
//! limit = "60/minute"
//!
//! [routes.feedback]
//! limit = "gcra 1/10min burst 5"
//! ```
//!
//! Each table under `routes` is one of the demo's routes (`feedback`,
//! `contact`, `search`) and holds its `limit`, a policy in the text of
//! [`ratewarden::Policy`]. A route the file leaves out keeps its
//! built-in limit. Anything else — an unknown route or key, a policy that
//! does not parse — is refused when the server starts, with the file's name
//! and the line and column of the offending value.

use std::path::Path;

use ratewarden::{ConfigError, Policy};
use serde::Deserialize;

use crate::RoutePolicies;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    routes: Routes,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Routes {
    feedback: Option<Route>,
    contact: Option<Route>,
    search: Option<Route>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Route {
    limit: Policy,
}

/// Reads the policies of the routes `path` lists.
///
/// Refuses a file that cannot be read, is not TOML, names an unknown route
/// or key, or holds a policy that does not parse; the error names the file
/// and, for its content, the line and column.
pub fn load(path: &Path) -> Result<RoutePolicies, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::Invalid(format!("cannot read {}: {e}", path.display())))?;
    parse(&text).map_err(|(at, message)| {
        let place = match at {
            Some((line, column)) => format!("{}: line {line}, column {column}", path.display()),
            None => path.display().to_string(),
        };
        ConfigError::Invalid(format!("{place}: {message}"))
    })
}

/// The policies in `text`, or the line and column (from 1) and message of
/// what is wrong.
fn parse(text: &str) -> Result<RoutePolicies, (Option<(usize, usize)>, String)> {
    let file: File = toml::from_str(text).map_err(|e| {
        let at = e.span().map(|span| line_and_column(text, span.start));
        (at, e.message().trim_end().to_owned())
    })?;
    let limit = |route: Option<Route>| route.map(|r| r.limit);
    Ok(RoutePolicies {
        feedback: limit(file.routes.feedback),
        contact: limit(file.routes.contact),
        search: limit(file.routes.search),
    })
}

fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_point_at_the_value() {
        let text = "[routes.search]\nlimit = \"60/fortnight\"\n";
        let (at, message) = parse(text).unwrap_err();
        assert_eq!(at, Some((2, 9)), "{message}");
        assert!(message.contains("unknown unit \"fortnight\""), "{message}");
        assert_eq!(line_and_column("ab\ncd", 4), (2, 2));
        assert_eq!(line_and_column("", 0), (1, 1));
    }
}
