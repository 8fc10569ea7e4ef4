//! Calibration batch plans (reproducible, every row once, errors when empty) and `calibrate` freezing every calibrating quantizer.

use dfdx::prelude::*;
use quant_dfdx::calibration::{calibrate, BatchPlan};
use quant_dfdx::convert::convert_model;
use quant_dfdx::layers::{QuantizedModuleExt, QuantizerMode};
use quant_dfdx::policy::Policy;

#[test]
fn plans_are_reproducible_and_cover_distinct_rows() {
    let plan = BatchPlan {
        batches: 3,
        batch_size: 4,
        seed: 11,
    };
    let batches = plan.rows(10).unwrap();
    assert_eq!(batches, plan.rows(10).unwrap());
    // Three batches of 10 rows: 4 + 4 + 2, each row once.
    assert_eq!(
        batches.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![4, 4, 2]
    );
    let mut seen: Vec<usize> = batches.concat();
    seen.sort();
    assert_eq!(seen, (0..10).collect::<Vec<_>>());
    // Shuffled, and by the seed.
    assert_ne!(batches.concat(), (0..10).collect::<Vec<_>>());
    let other = BatchPlan { seed: 12, ..plan };
    assert_ne!(other.rows(10).unwrap(), batches);
    // Fewer batches than the data holds: only the first ones.
    let one = BatchPlan { batches: 1, ..plan };
    assert_eq!(one.rows(10).unwrap(), batches[..1].to_vec());
}

#[test]
fn empty_plans_are_errors() {
    let plan = BatchPlan {
        batches: 1,
        batch_size: 1,
        seed: 0,
    };
    for (bad, what) in [
        (BatchPlan { batches: 0, ..plan }.rows(5), "batches"),
        (
            BatchPlan {
                batch_size: 0,
                ..plan
            }
            .rows(5),
            "batch size",
        ),
        (plan.rows(0), "rows"),
    ] {
        let message = bad.unwrap_err().to_string();
        assert!(message.contains(what), "{message}");
    }
}

#[test]
fn calibrate_freezes_every_calibrating_quantizer() {
    let dev = Cpu::seed_from_u64(1);
    let float = dev.build_module::<(Linear<3, 5>, ReLU, Linear<5, 2>), f32>();
    let policy = Policy::from_toml_str(
        "[weights]\ntraining_method = \"Lsq\"\nmethod = \"Symmetric\"\nbits = 4\n[input]\ntraining_method = \"Lsq\"\nmethod = \"Uniform\"\nbits = 4\n",
        "p.toml",
    )
    .unwrap();
    let mut model = convert_model(&float, &policy).unwrap();
    let x: Tensor<Rank2<8, 3>, f32, Cpu> = dev.sample_normal();
    assert_eq!(calibrate(&mut model, [x.clone(), x.clone()]).unwrap(), 4);
    let quantizers = model.quantizers().unwrap();
    assert_eq!(quantizers.len(), 4);
    assert!(quantizers
        .iter()
        .all(|(_, d)| d.mode == QuantizerMode::Frozen));
    // The frozen model quantizes: its output differs from the float model's.
    assert_ne!(
        model.try_forward(x.clone()).unwrap().as_vec(),
        float.forward(x).as_vec()
    );

    // No batches: the quantizers saw nothing, and the error names one.
    let mut fresh = convert_model(&float, &policy).unwrap();
    let none: [Tensor<Rank2<8, 3>, f32, Cpu>; 0] = [];
    let message = calibrate(&mut fresh, none).unwrap_err().to_string();
    assert!(message.contains("no data was observed"), "{message}");
    assert!(message.starts_with('0'), "{message}");
}
