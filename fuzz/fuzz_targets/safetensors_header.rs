//! The safetensors header check on arbitrary bytes: what it accepts, `safetensors` must parse
//! and slice without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quant_runtime::safetensors::check_safetensors;

fuzz_target!(|data: &[u8]| {
    if let Ok(header) = check_safetensors(data) {
        let st = safetensors::SafeTensors::deserialize(data).expect("checked header parses");
        for name in header.tensors.keys() {
            let t = st.tensor(name).expect("checked tensor exists");
            assert_eq!(Some(t.data()), header.data(data, name));
        }
    }
});
