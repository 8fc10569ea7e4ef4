//! Compile-fail tests of `#[mark_quantizer]` and the derive macros: every rejected attribute
//! form has a test here, with the expected error next to it (`.stderr`).

#[test]
fn macros_reject_bad_attributes_on_the_offending_token() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/mark_quantizer/*.rs");
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/derive/*.rs");
    t.pass("tests/ui/derive/pass/*.rs");
}
