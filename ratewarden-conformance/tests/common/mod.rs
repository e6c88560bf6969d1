//! What both teeth suites ask of a scenario run against something broken.

use std::fmt::Debug;

use ratewarden_conformance::ScenarioResult;

/// Panics unless `result`, `scenario` run against `subject` (`"a store"`,
/// `"a composition"`) with `defect`, is a failure whose message contains
/// every one of `because`.
pub fn assert_caught(
    scenario: &str,
    subject: &str,
    defect: &dyn Debug,
    result: ScenarioResult,
    because: &[&str],
) {
    match result {
        Ok(evidence) => panic!("{scenario} passed {subject} with {defect:?}: {evidence}"),
        Err(failure) => {
            println!("{scenario} vs {defect:?}: {failure}");
            for part in because {
                assert!(
                    failure.0.contains(part),
                    "{scenario} failed {defect:?} for another reason than expected \
                     (missing {part:?}): {failure}"
                );
            }
        }
    }
}
