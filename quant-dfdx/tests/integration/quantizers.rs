//! The built-in quantizers through the registry: each registered once, wrong configs refused,
//! `Inferable` and `set_qparams` exact, power-of-two scales, LSQ's gradients.

use quant_core::{
    registry, ActivationQuantizerConfig, ChannelLayout, IntegerGrid, ParamBank, ParamBankMut,
    QParams, QuantizationMethod, QuantizationTarget, QuantizerConfig, QuantizerInput,
    TrainingMethod, WeightsQuantizerConfig, MAX_PARAMETERS,
};

fn all_configs() -> Vec<QuantizerConfig> {
    let mut out = Vec::new();
    for entry in registry::registered() {
        if !entry.metadata.module_path.starts_with("quant_dfdx") {
            continue;
        }
        for method in entry.metadata.methods {
            let cfg: QuantizerConfig = match entry.metadata.target {
                QuantizationTarget::Weights => {
                    WeightsQuantizerConfig::new(entry.metadata.training_method, *method, 4).into()
                }
                QuantizationTarget::Activation => {
                    ActivationQuantizerConfig::new(entry.metadata.training_method, *method, 4)
                        .into()
                }
            };
            out.push(cfg);
        }
    }
    out
}

#[test]
fn every_built_in_is_registered_once() {
    use QuantizationMethod::*;
    use QuantizationTarget::*;
    let expected = [
        (Weights, Symmetric, TrainingMethod::Ste),
        (Weights, PowerOfTwo, TrainingMethod::Ste),
        (Weights, Uniform, TrainingMethod::Ste),
        (Activation, Symmetric, TrainingMethod::Ste),
        (Activation, PowerOfTwo, TrainingMethod::Ste),
        (Activation, Uniform, TrainingMethod::Ste),
        (Weights, Symmetric, TrainingMethod::Lsq),
        (Weights, Uniform, TrainingMethod::Lsq),
        (Activation, Symmetric, TrainingMethod::Lsq),
        (Activation, Uniform, TrainingMethod::Lsq),
        (Activation, Uniform, TrainingMethod::Pact),
        (Weights, Uniform, TrainingMethod::Dsq),
        (Activation, Uniform, TrainingMethod::Dsq),
    ];
    for (t, m, id) in expected {
        let e = registry::find(t, m, id).unwrap_or_else(|e| panic!("{t} {m} {id}: {e}"));
        assert!(
            e.metadata.module_path.starts_with("quant_dfdx::quantizers"),
            "{}",
            e.metadata.path()
        );
    }
    let err = registry::find(Weights, PowerOfTwo, TrainingMethod::Lsq)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("Lsq [Symmetric, Uniform]")
            && err.contains("Ste [Symmetric, PowerOfTwo, Uniform]"),
        "{err}"
    );
    let err = registry::find(Weights, Uniform, TrainingMethod::Pact)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "no quantizer registered for target Weights, method Uniform, training method Pact"
        ),
        "{err}"
    );
}

#[test]
fn building_with_a_wrong_config_is_an_error() {
    let entry = registry::find(
        QuantizationTarget::Weights,
        QuantizationMethod::Symmetric,
        TrainingMethod::Lsq,
    )
    .unwrap();
    let act: QuantizerConfig =
        ActivationQuantizerConfig::new(TrainingMethod::Lsq, QuantizationMethod::Symmetric, 4)
            .into();
    let err = entry.build(&act).unwrap_err().to_string();
    assert!(
        err.contains("it quantizes Weights but the config is for Activation"),
        "{err}"
    );
    let pow2: QuantizerConfig =
        WeightsQuantizerConfig::new(TrainingMethod::Lsq, QuantizationMethod::PowerOfTwo, 4).into();
    let err = entry.build(&pow2).unwrap_err().to_string();
    assert!(
        err.contains("method PowerOfTwo is not supported; it supports Symmetric, Uniform"),
        "{err}"
    );
    let mut bad_bits =
        WeightsQuantizerConfig::new(TrainingMethod::Lsq, QuantizationMethod::Symmetric, 1);
    assert!(registry::build(&bad_bits.clone().into())
        .unwrap_err()
        .to_string()
        .contains("bits = 1"));
    bad_bits.bits = 4;
    bad_bits.options.insert("grad_factr".into(), 1.0);
    let err = registry::build(&bad_bits.into()).unwrap_err().to_string();
    assert!(
        err.contains("no option `grad_factr`; valid options: grad_factor"),
        "{err}"
    );
}

/// Per-channel data: 3 channels of 40 values each, with ties, out-of-range values and zeros.
fn data() -> (Vec<f32>, [usize; 2]) {
    let x = (0..120)
        .map(|i| ((i * 37 % 53) as f32 - 26.0) * 0.11 + if i % 7 == 0 { 0.125 } else { 0.0 })
        .collect();
    (x, [3, 40])
}

#[test]
fn inferable_reproduces_the_forward_pass_exactly() {
    let (x, shape) = data();
    for config in all_configs() {
        let q = registry::build(&config).unwrap();
        for axis in [None, Some(0)] {
            if axis.is_some() && !config.per_channel() {
                continue;
            }
            let grid = config.grid(true).unwrap();
            let layout = ChannelLayout::new(&shape, axis).unwrap();
            let mut bank = vec![0.0; MAX_PARAMETERS * 3];
            let input = QuantizerInput::new(&x, layout, grid).unwrap();
            q.initialize(input, &mut ParamBankMut::new(&mut bank, 3).unwrap())
                .unwrap();
            let view = ParamBank::new(&bank, 3).unwrap();
            let mut y = vec![0.0; x.len()];
            q.forward(input, &view, &mut y).unwrap();
            let inferable = q.to_inferable(&view, grid, axis).unwrap();
            assert_eq!(
                inferable.fake_quantize(&x, &shape).unwrap(),
                y,
                "{config:?} axis {axis:?}"
            );
            // The grid's levels are actually used: more than two distinct outputs.
            let mut distinct: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
            distinct.sort();
            distinct.dedup();
            assert!(distinct.len() > 2, "{config:?}");
            // Outputs lie on the grid.
            let ints: Vec<i32> = inferable.quantize(&x, &shape).unwrap();
            assert!(ints
                .iter()
                .all(|v| *v >= grid.quant_min() && *v <= grid.quant_max()));
            let json = serde_json::to_string(&inferable).unwrap();
            assert_eq!(
                serde_json::from_str::<quant_core::InferableQuantizer>(&json).unwrap(),
                inferable
            );
        }
    }
}

#[test]
fn set_qparams_round_trips_through_qparams() {
    let grid = IntegerGrid::new(8, false, false).unwrap();
    let q = QParams::per_channel(0, vec![0.5, 0.25, 0.125], vec![3, 0, 7]).unwrap();
    for (id, method) in [
        (TrainingMethod::Ste, QuantizationMethod::Uniform),
        (TrainingMethod::Lsq, QuantizationMethod::Uniform),
    ] {
        let quantizer =
            registry::build(&WeightsQuantizerConfig::new(id, method, 8).into()).unwrap();
        let mut bank = vec![0.0; MAX_PARAMETERS * 3];
        quantizer
            .set_qparams(&q, grid, &mut ParamBankMut::new(&mut bank, 3).unwrap())
            .unwrap();
        let back = quantizer
            .qparams(&ParamBank::new(&bank, 3).unwrap(), grid, Some(0))
            .unwrap();
        assert_eq!(back, q, "{id}");
    }
}

#[test]
fn power_of_two_scales_are_powers_of_two() {
    let cfg = WeightsQuantizerConfig::new(TrainingMethod::Ste, QuantizationMethod::PowerOfTwo, 4);
    let q = registry::build(&cfg.into()).unwrap();
    let grid = IntegerGrid::new(4, true, false).unwrap();
    let (x, shape) = data();
    let mut bank = vec![0.0; MAX_PARAMETERS * 3];
    let layout = ChannelLayout::new(&shape, Some(0)).unwrap();
    q.initialize(
        QuantizerInput::new(&x, layout, grid).unwrap(),
        &mut ParamBankMut::new(&mut bank, 3).unwrap(),
    )
    .unwrap();
    let qp = q
        .qparams(&ParamBank::new(&bank, 3).unwrap(), grid, Some(0))
        .unwrap();
    for s in qp.scales() {
        assert_eq!(s.to_bits() & 0x007f_ffff, 0, "{s}");
        // Threshold covers the data: max |x| per channel <= 8 * s.
    }
    assert!(qp.scales().iter().all(|s| 8.0 * s >= 2.86));
}

#[test]
fn lsq_backward_adds_scale_and_zero_point_gradients() {
    let cfg = ActivationQuantizerConfig::new(TrainingMethod::Lsq, QuantizationMethod::Uniform, 4);
    let q = registry::build(&cfg.into()).unwrap();
    let grid = IntegerGrid::new(4, false, false).unwrap();
    let x = [0.1f32, 0.4, 2.0, -3.0, 0.26];
    let layout = ChannelLayout::per_tensor(x.len());
    let mut bank = vec![0.0; MAX_PARAMETERS];
    q.set_qparams(
        &QParams::per_tensor(0.1, 2).unwrap(),
        grid,
        &mut ParamBankMut::new(&mut bank, 1).unwrap(),
    )
    .unwrap();
    let mut dx = vec![0.0; 5];
    let mut dbank = vec![0.0; MAX_PARAMETERS];
    let dy = [1.0; 5];
    q.backward(
        QuantizerInput::new(&x, layout, grid).unwrap(),
        &ParamBank::new(&bank, 1).unwrap(),
        &dy,
        &mut dx,
        &mut ParamBankMut::new(&mut dbank, 1).unwrap(),
    );
    let (edx, eds, edz) = quant_core::kernels::fake_quantize_learnable_per_tensor_affine_backward(
        &x,
        &dy,
        0.1,
        2.0,
        0,
        15,
        quant_core::dfdx_ops::lsq_grad_factor(5, grid),
    )
    .unwrap();
    assert_eq!(dx, edx);
    assert_eq!((dbank[0], dbank[1]), (eds, edz));
    assert_eq!(dx, vec![1.0, 1.0, 0.0, 0.0, 1.0]);
}
