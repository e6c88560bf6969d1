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
    // The block's `use` lines and hidden (`# `) lines are the README
    // doctest's; what a reader sees besides them is quoted.
    let blocks: Vec<String> = section
        .split("```rust")
        .skip(1)
        .map(|b| b.split_once('\n').map_or("", |(_, code)| code))
        .map(|b| b.split("```").next().unwrap())
        .map(|code| {
            code.lines()
                .filter(|l| !l.starts_with("use ") && !l.starts_with("# ") && *l != "#")
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect();
    assert_eq!(blocks.len(), 1, "snippets in the section");
    for block in &blocks {
        let block = block.as_str();
        assert!(
            example.contains(block),
            "the README quotes what examples/hello.rs does not hold:\n{block}"
        );
    }
}
