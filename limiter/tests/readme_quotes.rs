//! The README's Rust snippets are quoted from examples that compile and run
//! (`examples/http_layer.rs`, `examples/compositions.rs`): this keeps the
//! quotes true to them.

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
    let mut quoted = 0;
    for block in section.split("```rust\n").skip(1) {
        let code = block.split("```").next().unwrap().trim_end();
        assert!(
            source.contains(code),
            "the README quotes what examples/{example} does not hold:\n{code}"
        );
        quoted += 1;
    }
    assert_eq!(quoted, blocks, "snippets found in the section {heading:?}");
}

#[test]
fn the_readme_quotes_the_http_example_verbatim() {
    assert_quoted("### The HTTP layer's options", "\n## ", "http_layer.rs", 3);
}

#[test]
fn the_readme_quotes_the_composition_example_verbatim() {
    assert_quoted(
        "### Composition: tiers, fallback, failure policy, escalation",
        "\n### ",
        "compositions.rs",
        2,
    );
}
