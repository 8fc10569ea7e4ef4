//! The float layers composed with dfdx's own into a CNN: it builds, trains with Adam, and
//! round-trips through safetensors.

use dfdx::nn::{LoadFromSafetensors, SaveToSafetensors};
use dfdx::optim::Adam;
use dfdx::prelude::*;
use quant_dfdx::nn::builders;

type Cnn = (
    builders::Conv2d<1, 8, 3, 1, 1>,
    BatchNorm2D<8>,
    ReLU,
    builders::MaxPool2d<2>,
    builders::Flatten<128>,
    Linear<128, 10>,
);

const BATCH: usize = 16;

/// Random 8x8 images with random labels (one-hot), which a CNN this size can memorise.
fn data(
    dev: &Cpu,
) -> (
    Tensor<Rank4<BATCH, 1, 8, 8>, f32, Cpu>,
    Tensor<Rank2<BATCH, 10>, f32, Cpu>,
) {
    let x = dev.sample_normal();
    let labels: Tensor<Rank1<BATCH>, f32, _> = dev.sample_uniform();
    let mut one_hot = vec![0.0f32; BATCH * 10];
    for (i, u) in labels.as_vec().iter().enumerate() {
        one_hot[i * 10 + ((u * 10.0) as usize).min(9)] = 1.0;
    }
    (x, dev.tensor_from_vec(one_hot, Default::default()))
}

#[test]
fn cnn_trains_with_adam() {
    let dev = Cpu::seed_from_u64(31);
    let mut model = dev.build_module::<Cnn, f32>();
    let mut opt = Adam::new(
        &model,
        AdamConfig {
            lr: 1e-2,
            ..Default::default()
        },
    );
    let (x, y) = data(&dev);
    let mut grads = model.alloc_grads();
    let mut losses = Vec::new();
    for _ in 0..15 {
        let logits = model.forward_mut(x.trace(grads));
        let loss = cross_entropy_with_logits_loss(logits, y.clone());
        losses.push(loss.array());
        grads = loss.backward();
        opt.update(&mut model, &grads)
            .expect("every parameter has a gradient");
        model.zero_grads(&mut grads);
    }
    let (first, last) = (losses[0], losses[losses.len() - 1]);
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    assert!(last < 0.5 * first, "loss should fall: {losses:?}");
    // The convolution itself learned.
    let fresh = dev.build_module::<Cnn, f32>();
    assert_ne!(model.0.weight.as_vec(), fresh.0.weight.as_vec());
}

#[test]
fn cnn_runs_on_run_time_batch_and_image_sizes() {
    let dev = Cpu::seed_from_u64(32);
    let model = dev.build_module::<Cnn, f32>();
    let x = dev.sample_normal_like(&(5usize, Const::<1>, 8usize, 8usize));
    let y = model.forward(x);
    assert_eq!(*y.shape(), (5, Const::<10>));
    // A 6x6 image flattens to 72 features, not 128: a dfdx error, not a panic.
    let x = dev.sample_normal_like(&(5usize, Const::<1>, 6usize, 6usize));
    assert!(model.try_forward(x).is_err());
}

#[test]
fn cnn_save_load_round_trip_reproduces_outputs() {
    let dev = Cpu::seed_from_u64(33);
    let mut model = dev.build_module::<Cnn, f32>();
    // One training step so that the batch-norm running statistics are not at their defaults.
    let (x, y) = data(&dev);
    let mut opt = Adam::new(&model, AdamConfig::default());
    let grads = model.alloc_grads();
    let loss = cross_entropy_with_logits_loss(model.forward_mut(x.trace(grads)), y);
    opt.update(&mut model, &loss.backward()).unwrap();

    let path = std::env::temp_dir().join(format!(
        "quant-dfdx-nn-cnn-{}.safetensors",
        std::process::id()
    ));
    model.save_safetensors(&path).unwrap();
    let mut loaded = dev.build_module::<Cnn, f32>();
    let before = loaded.forward(x.clone()).as_vec();
    loaded.load_safetensors(&path).unwrap();
    std::fs::remove_file(&path).ok();

    let expected = model.forward(x.clone()).as_vec();
    assert_ne!(
        before, expected,
        "a fresh model should differ before loading"
    );
    assert_eq!(loaded.forward(x).as_vec(), expected);
    assert_eq!(loaded.0.weight.as_vec(), model.0.weight.as_vec());
    assert_eq!(loaded.0.bias.as_vec(), model.0.bias.as_vec());
}
