//! The README's actix-web snippet is quoted from `examples/hello.rs`: this
//! keeps the quote true to it.

#[test]
fn the_readme_quotes_the_actix_example_verbatim() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/../README.md")).unwrap();
    let example = std::fs::read_to_string(format!("{root}/examples/hello.rs")).unwrap();
    let example: String = example
        .lines()
        .map(|line| line.strip_prefix("    ").unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n");
    let section = readme
        .split("### actix-web")
        .nth(1)
        .expect("the README has a section \"### actix-web\"")
        .split("\n### ")
        .next()
        .unwrap()
        .split("\n## ")
        .next()
        .unwrap();
    let blocks: Vec<&str> = section
        .split("```rust\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap().trim_end())
        .collect();
    assert_eq!(blocks.len(), 1, "snippets in the section");
    for block in blocks {
        assert!(
            example.contains(block),
            "the README quotes what examples/hello.rs does not hold:\n{block}"
        );
    }
}
