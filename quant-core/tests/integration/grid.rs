//! Integer grids, scales and zero points: ranges per bit width, the symmetric conventions, power-of-two thresholds, uniform ranges around zero, validation on load.

use quant_core::{
    power_of_two_scale, power_of_two_threshold, qparams_from_range, symmetric_scale,
    uniform_qparams, IntegerGrid, QParams, QuantError, QuantizationMethod, MIN_SCALE,
};

#[test]
fn grid_ranges() {
    let cases = [
        (8, true, false, -128, 127),
        (8, true, true, -127, 127),
        (8, false, false, 0, 255),
        (8, false, true, 0, 254),
        (2, true, false, -2, 1),
        (2, false, false, 0, 3),
        (16, true, false, -32768, 32767),
    ];
    for (b, s, n, lo, hi) in cases {
        let g = IntegerGrid::new(b, s, n).unwrap();
        assert_eq!((g.quant_min(), g.quant_max()), (lo, hi), "{g:?}");
    }
    assert_eq!(
        IntegerGrid::new(1, true, false),
        Err(QuantError::InvalidBits { bits: 1 })
    );
    let err = serde_json::from_str::<IntegerGrid>(r#"{"bits": 40, "signed": true}"#).unwrap_err();
    assert!(
        err.to_string().contains("bits = 40 is out of range"),
        "{err}"
    );
}

#[test]
fn symmetric_conventions() {
    // MCT: T / 2^(b-1); NVIDIA (narrow): amax / 127; unsigned: T / 2^b.
    assert_eq!(
        symmetric_scale(1.0, IntegerGrid::INT8).unwrap(),
        1.0 / 128.0
    );
    assert_eq!(
        symmetric_scale(127.0, IntegerGrid::new(8, true, true).unwrap()).unwrap(),
        1.0
    );
    assert_eq!(
        symmetric_scale(2.0, IntegerGrid::UINT8).unwrap(),
        2.0 / 256.0
    );
    assert_eq!(symmetric_scale(0.0, IntegerGrid::INT8).unwrap(), MIN_SCALE);
    assert!(symmetric_scale(f32::NAN, IntegerGrid::INT8).is_err());
}

#[test]
fn power_of_two_rounds_up() {
    for (t, p) in [
        (1.0, 1.0),
        (1.5, 2.0),
        (0.3, 0.5),
        (4.0, 4.0),
        (4.0001, 8.0),
        (0.125, 0.125),
    ] {
        assert_eq!(power_of_two_threshold(t).unwrap(), p, "{t}");
    }
    assert!(power_of_two_threshold(f32::INFINITY).is_err());
}

#[test]
fn power_of_two_scales_stay_powers_of_two_with_narrow_range() {
    for bits in 2..=16 {
        for (signed, narrow) in [(true, false), (true, true), (false, false), (false, true)] {
            let g = IntegerGrid::new(bits, signed, narrow).unwrap();
            for t in [0.0, 1e-30, 0.3, 1.0, 5.0, 131072.0, 1e38] {
                let (s, z) = qparams_from_range(QuantizationMethod::PowerOfTwo, g, -t, t)
                    .unwrap_or_else(|e| panic!("{g:?} {t}: {e}"));
                assert_eq!((s.to_bits() & 0x007f_ffff, z), (0, 0), "{g:?} {t}: {s}");
                // The rounded-up threshold covers T (up to the narrow range's last level).
                assert!(
                    s * g.power_of_two_divisor() >= t.min(3e38),
                    "{g:?} {t}: {s}"
                );
            }
        }
    }
    // Above 2^127 the power of two overflows f32.
    assert!(power_of_two_scale(3e38, IntegerGrid::UINT8).is_err());
}

#[test]
fn uniform_makes_zero_exact() {
    let (s, z) = uniform_qparams(-1.0, 3.0, IntegerGrid::UINT8).unwrap();
    assert_eq!(s, 4.0 / 255.0);
    assert_eq!(z, (1.0f32 / s).round_ties_even() as i32);
    // A range that excludes 0 is widened to contain it.
    let (s, z) = uniform_qparams(2.0, 4.0, IntegerGrid::UINT8).unwrap();
    assert_eq!((s, z), (4.0 / 255.0, 0));
    let (s, z) = uniform_qparams(-4.0, -2.0, IntegerGrid::UINT8).unwrap();
    assert_eq!((s, z), (4.0 / 255.0, 255));
    // Constant tensor: finite positive scale.
    let (s, _) = uniform_qparams(0.0, 0.0, IntegerGrid::UINT8).unwrap();
    assert_eq!(s, MIN_SCALE);
}

#[test]
fn qparams_validate() {
    assert!(QParams::per_tensor(0.0, 0).is_err());
    assert!(QParams::per_tensor(f32::NAN, 0).is_err());
    assert!(QParams::new(vec![1.0, 2.0], vec![0], Some(0)).is_err());
    assert!(QParams::new(vec![1.0, 2.0], vec![0, 0], None).is_err());
    let q = QParams::per_channel(1, vec![0.5, 0.25], vec![0, 3]).unwrap();
    let json = serde_json::to_string(&q).unwrap();
    assert_eq!(serde_json::from_str::<QParams>(&json).unwrap(), q);
    assert!(serde_json::from_str::<QParams>(r#"{"scales":[-1.0],"zero_points":[0]}"#).is_err());
    assert!(q
        .check_zero_points(IntegerGrid::new(2, false, false).unwrap())
        .is_ok());
    assert!(q
        .check_zero_points(IntegerGrid::new(2, true, false).unwrap())
        .is_err());
}
