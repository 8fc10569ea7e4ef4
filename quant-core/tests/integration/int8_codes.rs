use quant_core::__internals::*;
use quant_core::int8::Isa;
use quant_core::QuantError;

/// The definition `codes_into` vectorises: one value at a time, the library's rounding
/// for any magnitude, Rust's saturating conversion.
fn reference(v: f32, scale: f32, zero_point: i32) -> i32 {
    let code = round_ties_even_f64(v as f64 / scale as f64) + zero_point as f64;
    code.clamp(i32::MIN as f64, i32::MAX as f64) as i32
}

#[test]
fn codes_are_the_reference_ones_on_every_width() {
    let scales = [1.0f32, 0.1, 3.7e-3, 1e-30, 6.5e4, 2.0f32.powi(-20)];
    let zero_points = [0, 7, -128, 255, i32::MAX, i32::MIN, -(1 << 30)];
    // Grid values with their ties (half codes) and neighbours, values far off the grid,
    // beyond i32 and beyond 2^51 codes, signed zeros, subnormals and the extremes.
    let mut next = crate::test_rng::xorshift(0x2545_f491_4f6c_dd1du64);
    for &scale in &scales {
        let mut x: Vec<f32> = vec![0.0, -0.0, f32::MIN_POSITIVE, -1e-45, f32::MAX, f32::MIN];
        for code in -300i64..300 {
            let v = code as f32 * scale;
            x.extend([v, v.next_up(), v.next_down(), (code as f32 + 0.5) * scale]);
        }
        for _ in 0..2000 {
            let bits = next() as u32;
            let v = f32::from_bits(bits);
            if v.is_finite() {
                x.push(v);
            }
        }
        for &zero_point in &zero_points {
            let want: Vec<i32> = x.iter().map(|&v| reference(v, scale, zero_point)).collect();
            for isa in Isa::available() {
                let mut got = vec![0; x.len()];
                assert!(codes_into(isa, &x, scale, zero_point, &mut got));
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g, w,
                        "{isa:?}: x = {:e}, scale {scale:e}, zero point {zero_point}",
                        x[i]
                    );
                }
            }
        }
    }
}

#[test]
fn a_value_that_is_not_finite_is_named_on_every_width() {
    for isa in Isa::available() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut x = vec![0.5f32; 37];
            x[29] = bad;
            let mut out = vec![0; x.len()];
            assert!(!codes_into(isa, &x, 0.5, 0, &mut out), "{isa:?} {bad}");
            match codes_of("gelu input", &x, 0.5, 0, isa) {
                Err(QuantError::NonFinite { what, .. }) => assert_eq!(what, "gelu input[29]"),
                other => panic!("{isa:?}: {other:?}"),
            }
        }
    }
}
