//! The README's composition snippets are quoted from
//! `examples/compositions.rs`, which compiles and runs: this keeps the
//! quotes true to it.

#[test]
fn the_readme_quotes_the_composition_example_verbatim() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/../README.md")).unwrap();
    let example = std::fs::read_to_string(format!("{root}/examples/compositions.rs")).unwrap();
    // The example's body is indented once, inside `main`.
    let example: String = example
        .lines()
        .map(|line| line.strip_prefix("    ").unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n");
    let section = readme
        .split("### Composition: tiers, fallback, failure policy, escalation")
        .nth(1)
        .expect("the README has the section")
        .split("\n### ")
        .next()
        .unwrap();
    let mut quoted = 0;
    for block in section.split("```rust\n").skip(1) {
        let code = block.split("```").next().unwrap().trim_end();
        assert!(
            example.contains(code),
            "the README quotes what examples/compositions.rs does not hold:\n{code}"
        );
        quoted += 1;
    }
    assert_eq!(quoted, 2, "snippets found in the section");
}
