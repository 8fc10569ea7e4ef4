//! Compile-fail tests of `#[mark_quantizer]` and the derive macros: every rejected attribute
//! form has a test here, with the expected error next to it (`.stderr`). The `pass` cases are
//! crates outside the workspace (trybuild builds each as its own project) that must build and
//! run: a quantizer registered by its own crate, a derived layer, and a user's dfdx
//! `TransformerEncoder` converted by a policy file, trained and run on integers.
//!
//! Both sets are in the slow tier: trybuild checks (compile-fail) or builds (pass) every
//! dependency again in a project of its own, over a minute before any case runs, which the
//! default tier's ten minutes cannot spare. This package's dependencies are what trybuild's
//! project builds: the facade without its default features (tract), and nothing else.

#[test]
#[ignore = "slow tier: trybuild checks every dependency again (over a minute on 2 cores)"]
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
