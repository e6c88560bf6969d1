//! The README's Rust snippets are quoted from examples that compile
//! (`examples/quickstart.rs`, `examples/shared_store.rs`,
//! `examples/compositions.rs`, `examples/plans.rs`, `examples/outbound.rs`):
//! this keeps the quotes true to them. A snippet's `use` lines and the
//! lines rustdoc hides (`# `) are the README doctest's (`ReadmeDoctests`
//! in src/lib.rs), not the example's; every other run of lines is quoted.

/// The ```rust blocks of `section`, whatever their attributes
/// (`rust,no_run`), as the runs of lines a reader sees besides `use` lines.
fn quoted_runs(section: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    for block in section.split("```rust").skip(1) {
        let Some((_attributes, code)) = block.split_once('\n') else {
            continue;
        };
        let code = code.split("```").next().unwrap_or_default();
        let mut runs = vec![String::new()];
        for line in code.lines() {
            let hidden = line == "#" || line.starts_with("# ");
            if hidden || line.starts_with("use ") {
                runs.push(String::new());
            } else {
                let run = runs.last_mut().expect("one run at least");
                run.push_str(line);
                run.push('\n');
            }
        }
        runs.retain(|run| !run.trim().is_empty());
        blocks.push(runs.iter().map(|run| run.trim_end().to_owned()).collect());
    }
    blocks
}

/// Checks that every ```rust block of the README section under `heading`
/// (up to the next heading of the same level or above, `until`) appears in
/// `examples/{example}`, whose body is indented once inside a function, and
/// that the section quotes exactly `blocks` of them.
fn assert_quoted(heading: &str, until: &str, example: &str, blocks: usize) {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/../README.md")).unwrap();
    let source = std::fs::read_to_string(format!("{root}/examples/{example}")).unwrap();
    let source: String = source
        .lines()
        .map(|line| line.strip_prefix("    ").unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n");
    let section = readme
        .split(heading)
        .nth(1)
        .unwrap_or_else(|| panic!("the README has no section {heading:?}"))
        .split(until)
        .next()
        .unwrap();
    let quoted = quoted_runs(section);
    for code in quoted.iter().flatten() {
        assert!(
            source.contains(code.as_str()),
            "the README quotes what examples/{example} does not hold:\n{code}"
        );
    }
    assert_eq!(
        quoted.len(),
        blocks,
        "snippets found in the section {heading:?}"
    );
}

/// The README's section under `heading`, up to the next `until`.
fn section(heading: &str, until: &str) -> String {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    readme
        .split(heading)
        .nth(1)
        .unwrap_or_else(|| panic!("the README has no section {heading:?}"))
        .split(until)
        .next()
        .unwrap()
        .to_owned()
}

#[test]
fn the_readme_first_example_is_examples_quickstart_whole() {
    let section = section("### Protect a route", "\n### ");
    let block = section
        .split("```rust,no_run\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a rust block under \"Protect a route\"");
    let example = include_str!("../examples/quickstart.rs");
    let code = example
        .split_once("\n\n")
        .map(|(_docs, code)| code)
        .unwrap_or(example);
    assert_eq!(
        block, code,
        "the README's first example and examples/quickstart.rs differ"
    );
    assert!(code.contains("fn main"), "not a whole program");
}

#[test]
fn the_readme_quotes_the_shared_store_example_verbatim() {
    assert_quoted(
        "### Share a store across a fleet",
        "\n### ",
        "shared_store.rs",
        1,
    );
}

#[test]
fn the_readme_quotes_the_composition_example_verbatim() {
    assert_quoted("### Compose stores", "\n### ", "compositions.rs", 1);
}

#[test]
fn the_readme_quotes_the_plans_example_verbatim() {
    assert_quoted("### Limits per plan", "\n### ", "plans.rs", 1);
}

#[test]
fn the_readme_quotes_the_outbound_example_verbatim() {
    assert_quoted(
        "### Wait for a permit (outbound calls)",
        "\n### ",
        "outbound.rs",
        1,
    );
}

#[test]
fn the_readme_quotes_the_grpc_example_verbatim() {
    assert_quoted("### gRPC (tonic)", "\n### ", "grpc.rs", 1);
}

#[test]
fn the_readme_quotes_the_limits_file_example_verbatim() {
    assert_quoted("### Limits from a file", "\n## ", "limits_file.rs", 1);
}
