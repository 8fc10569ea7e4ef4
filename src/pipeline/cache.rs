//! The float-model cache: where a seed's float checkpoint lives, keyed by everything that
//! determines it, and how it is written.

use std::path::{Path, PathBuf};

use dfdx::nn::SaveToSafetensors;
use dfdx::prelude::*;

use quant_runtime::fs::StagedFile;

use super::{output_error, RunConfig, RunError};
use crate::data::Samples;

/// Version of the float-checkpoint cache key: bump it when a change of the code changes the
/// float model that the same recipe, data and seed train.
pub const CACHE_KEY_VERSION: u32 = 2;

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// SHA-256 of a split's rows: what the float model is trained on (the features, then each
/// label's low byte and, for data of more than 256 classes, its full value).
pub(crate) fn split_digest(split: &Samples) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update((split.len() as u64).to_le_bytes());
    for v in split.features() {
        h.update(v.to_le_bytes());
    }
    let bytes: Vec<u8> = split.labels().iter().map(|l| *l as u8).collect();
    h.update(&bytes);
    if split.labels().iter().any(|l| *l > 255) {
        for l in split.labels() {
            h.update((*l as u64).to_le_bytes());
        }
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The float checkpoint of `seed`, keyed by everything that determines it: the training
/// data (a SHA-256 of its rows), the model's name, the whole `[float]` recipe, the hold-out,
/// the seed, the key's version and quant's version. A run that changes any of them trains anew.
pub(crate) fn cache_path(
    dir: &Path,
    model: &str,
    cfg: &RunConfig,
    seed: u64,
    train_digest: &str,
) -> PathBuf {
    let code = (CACHE_KEY_VERSION, env!("CARGO_PKG_VERSION"));
    versioned_cache_path(dir, model, cfg, seed, train_digest, code)
}

/// [`cache_path`] for the code version `(key version, quant version)`.
fn versioned_cache_path(
    dir: &Path,
    model: &str,
    cfg: &RunConfig,
    seed: u64,
    train_digest: &str,
    (key_version, quant_version): (u32, &str),
) -> PathBuf {
    let ingredients = serde_json::json!({
        "key_version": key_version,
        "quant_version": quant_version,
        "model": model,
        "float": cfg.float,
        "holdout": cfg.data.holdout,
        "seed": seed,
        "train_data_sha256": train_digest,
    });
    let key = sha256_hex(ingredients.to_string().as_bytes());
    // The name only makes the file recognisable; the key decides. Keep it a plain file name.
    let name: String = model
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    dir.join(format!("{name}-seed{seed}-{}.safetensors", &key[..16]))
}

/// Writes a float checkpoint through a temporary file and a rename (a concurrent run reading
/// the cache sees the old file or the new one, never half of one).
pub(crate) fn save_checkpoint<M: SaveToSafetensors<f32, Cpu>>(
    model: &M,
    path: &Path,
) -> Result<(), RunError> {
    StagedFile::with(path, |tmp| {
        model
            .save_safetensors(tmp)
            .map_err(|e| std::io::Error::other(format!("{e:?}")))
    })
    .and_then(StagedFile::commit)
    .map_err(output_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Holdout;
    use crate::pipeline::config;

    const BASE: &str = "[model]\nkind = \"mlp\"\n[quantization.weights]\ntraining_method = \"Lsq\"\nmethod = \"Symmetric\"\nbits = 4\n[quantization.input]\ntraining_method = \"Lsq\"\nmethod = \"Uniform\"\nbits = 4\n";

    #[test]
    fn float_cache_key_covers_every_ingredient() {
        let base = RunConfig::from_toml_str(BASE, "t").unwrap();
        let dir = Path::new("cache");
        let rows =
            |features: Vec<f32>, labels: Vec<usize>| Samples::new(features, labels, &[64]).unwrap();
        let data = rows(vec![0.5; 3 * 64], vec![1, 2, 3]);
        let digest = split_digest(&data);
        let key =
            |cfg: &RunConfig, seed: u64, digest: &str| cache_path(dir, "mlp", cfg, seed, digest);
        let reference = key(&base, 3, &digest);
        // Stable: the same ingredients give the same file, named after the model and seed.
        assert_eq!(
            reference,
            key(&base.clone(), 3, &split_digest(&data.clone()))
        );
        let name = reference
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(
            name.starts_with("mlp-seed3-") && name.ends_with(".safetensors"),
            "{name}"
        );

        // Each ingredient, changed alone, gives another file.
        let mut variants: Vec<(&str, PathBuf)> = Vec::new();
        let shifted = rows(vec![0.5; 3 * 64], vec![2, 3, 4]);
        variants.push(("labels", key(&base, 3, &split_digest(&shifted))));
        let mut one_pixel = vec![0.5; 3 * 64];
        one_pixel[100] = 0.25;
        variants.push((
            "one pixel",
            key(&base, 3, &split_digest(&rows(one_pixel, vec![1, 2, 3]))),
        ));
        let fewer = rows(vec![0.5; 2 * 64], vec![1, 2]);
        variants.push(("rows", key(&base, 3, &split_digest(&fewer))));
        variants.push(("seed", key(&base, 4, &digest)));
        variants.push(("model", cache_path(dir, "cnn", &base, 3, &digest)));
        type Edit = (&'static str, fn(&mut RunConfig));
        let edits: Vec<Edit> = vec![
            ("epochs", |c| c.float.epochs += 1),
            ("batch size", |c| c.float.batch_size += 1),
            ("lr", |c| c.float.lr *= 2.0),
            ("schedule", |c| {
                c.float.schedule = config::Schedule::Constant
            }),
            ("shift", |c| c.float.shift = 1),
            ("optimizer", |c| c.float.optimizer = config::Optimizer::Sgd),
            ("weight decay", |c| c.float.weight_decay = 0.01),
            ("label smoothing", |c| c.float.label_smoothing = 0.1),
            ("holdout fold", |c| {
                c.data.holdout = Some(Holdout { folds: 5, fold: 1 })
            }),
            ("holdout folds", |c| {
                c.data.holdout = Some(Holdout { folds: 4, fold: 1 })
            }),
        ];
        for (what, edit) in edits {
            let mut cfg = base.clone();
            edit(&mut cfg);
            variants.push((what, key(&cfg, 3, &digest)));
        }
        let mut seen = std::collections::BTreeMap::new();
        seen.insert(reference, "reference");
        for (what, path) in variants {
            if let Some(other) = seen.insert(path.clone(), what) {
                panic!(
                    "`{what}` and `{other}` share the cache file {}",
                    path.display()
                );
            }
        }

        // The code's version.
        let code = (CACHE_KEY_VERSION, env!("CARGO_PKG_VERSION"));
        let versioned =
            |code: (u32, &str)| versioned_cache_path(dir, "mlp", &base, 3, &digest, code);
        assert_eq!(versioned(code), key(&base, 3, &digest));
        assert_ne!(versioned((CACHE_KEY_VERSION + 1, code.1)), versioned(code));
        assert_ne!(
            versioned((CACHE_KEY_VERSION, "0.0.0-other")),
            versioned(code)
        );

        // The QAT recipe and the policy do not change the float model: same file.
        let mut cfg = base.clone();
        cfg.qat.epochs += 7;
        cfg.calibration.batches += 1;
        assert_eq!(key(&cfg, 3, &digest), key(&base, 3, &digest));
    }
}
