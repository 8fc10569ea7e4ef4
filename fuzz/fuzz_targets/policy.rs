//! The policy-file loader on arbitrary text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quant_dfdx::policy::Policy;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Err(e) = Policy::from_toml_str(text, "fuzz.toml") {
            assert!(e.to_string().contains("fuzz.toml"));
        }
    }
});
