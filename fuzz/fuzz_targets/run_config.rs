//! The run-file loader (model, schedules, embedded policy) on arbitrary text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quant::pipeline::RunConfig;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Err(e) = RunConfig::from_toml_str(text, "fuzz-run.toml") {
            assert!(e.to_string().contains("fuzz-run.toml"));
        }
    }
});
