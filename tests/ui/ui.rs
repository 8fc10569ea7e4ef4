//! Compile-fail tests of `#[mark_quantizer]` and the derive macros: every rejected attribute
//! form has a test here, with the expected error next to it (`.stderr`). The `pass` cases are
//! crates outside the workspace (trybuild builds each as its own project) that must build and
//! run: a quantizer registered by its own crate, a derived layer, and a user's dfdx
//! `TransformerEncoder` converted by a policy file, trained and run on integers.
//!
//! The compile-fail cases only type-check (trybuild runs `cargo check` when a set has no pass
//! case), so they stay in the default tier; the pass cases build every dependency a second time
//! and train, so they are in the slow tier. This package's dependencies are what trybuild's
//! project builds: the facade without its default features (tract), and nothing else.

#[test]
fn macros_reject_bad_attributes_on_the_offending_token() {
    let t = trybuild::TestCases::new();
    t.compile_fail("mark_quantizer/*.rs");
    t.compile_fail("derive/*.rs");
}

#[test]
#[ignore = "slow tier: trybuild builds every dependency again and the crates train"]
fn crates_outside_the_workspace_build_and_run() {
    let t = trybuild::TestCases::new();
    t.pass("pass/*.rs");
    t.pass("derive/pass/*.rs");
}
