//! The `Store` trait's `# Contract` and the scenarios are one list: every
//! bullet of the contract names a scenario, in `SCENARIOS` order, and every
//! scenario is a bullet.

use ratewarden_conformance::SCENARIOS;

#[test]
fn store_contract_lists_exactly_the_scenarios_in_order() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../ratewarden-core/src/store/mod.rs"
    );
    let source =
        std::fs::read_to_string(path).expect("ratewarden-core's store.rs is beside this crate");
    let contract = source
        .split("/// # Contract")
        .nth(1)
        .expect("the Store trait's docs have a # Contract section");
    let contract = &contract[..contract.find("pub trait Store").expect("the trait follows")];
    let bullets: Vec<&str> = contract
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("/// * `"))
        .map(|l| &l[..l.find('`').expect("a bullet starts with `name`")])
        .collect();
    let names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
    assert_eq!(bullets, names);
}
