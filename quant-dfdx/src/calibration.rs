//! Calibration (post-training quantization): show a converted model a few batches while its
//! quantizers observe, then turn what they saw into frozen quantization parameters.
//!
//! [`calibrate`] works on any converted model (tuples, the built-in layers, derived models);
//! [`BatchPlan`] draws the batches' rows from a data set reproducibly, from a seed.
//!
//! ```
//! use dfdx::prelude::*;
//! use quant_dfdx::calibration::{calibrate, BatchPlan};
//! use quant_dfdx::{convert::convert_model, policy::Policy};
//!
//! let dev = Cpu::seed_from_u64(0);
//! let float = dev.build_module::<(Linear<4, 8>, ReLU, Linear<8, 3>), f32>();
//! let policy = Policy::from_toml_str(
//!     "[weights]\ntraining_method = \"Lsq\"\nmethod = \"Symmetric\"\nbits = 8\n[input]\ntraining_method = \"Lsq\"\nmethod = \"Uniform\"\nbits = 8\n",
//!     "policy.toml",
//! )?;
//! let mut model = convert_model(&float, &policy)?;
//!
//! // 100 samples of 4 features; 3 batches of 16 rows, shuffled by seed 7.
//! let samples: Vec<f32> = (0..400).map(|i| (i as f32 * 0.37).sin()).collect();
//! let plan = BatchPlan { batches: 3, batch_size: 16, seed: 7 };
//! let batches = plan.rows(100)?.into_iter().map(|rows| {
//!     let x: Vec<f32> = rows.iter().flat_map(|r| samples[r * 4..r * 4 + 4].to_vec()).collect();
//!     dev.tensor_from_vec(x, (rows.len(), Const::<4>))
//! });
//! assert_eq!(calibrate(&mut model, batches)?, 4); // weights and input of both layers
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use dfdx::prelude::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use quant_core::{QuantError, Result};

use crate::layers::{QuantizedModule, QuantizedModuleExt};

/// Which rows of a data set calibration sees: the rows are shuffled by a generator seeded with
/// `seed` and cut into batches of `batch_size`, of which the first `batches` are used (fewer
/// when the data set runs out; the last may be shorter). The same plan and row count give the
/// same batches on every machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchPlan {
    /// How many batches (at least 1).
    pub batches: usize,
    /// Rows per batch (at least 1).
    pub batch_size: usize,
    /// Seed of the shuffle.
    pub seed: u64,
}

impl BatchPlan {
    /// The row indices of each batch, for a data set of `rows` rows.
    ///
    /// # Errors
    /// [`QuantError::InvalidValue`] when `batches` or `batch_size` is 0, or `rows` is 0.
    pub fn rows(&self, rows: usize) -> Result<Vec<Vec<usize>>> {
        let invalid = |what: &str, expected: &str| QuantError::InvalidValue {
            what: what.into(),
            value: "0".into(),
            expected: expected.into(),
        };
        if self.batches == 0 {
            return Err(invalid("calibration batches", "at least one batch"));
        }
        if self.batch_size == 0 {
            return Err(invalid(
                "calibration batch size",
                "at least one row per batch",
            ));
        }
        if rows == 0 {
            return Err(invalid(
                "calibration rows",
                "a data set with at least one row to calibrate on",
            ));
        }
        let mut rng = StdRng::seed_from_u64(self.seed);
        let mut order: Vec<usize> = (0..rows).collect();
        order.shuffle(&mut rng);
        Ok(order
            .chunks(self.batch_size)
            .take(self.batches)
            .map(<[usize]>::to_vec)
            .collect())
    }
}

/// Calibrates a converted model: runs `forward_mut` on each batch (in evaluation mode, no
/// tape), so that every quantizer in Calibrating mode observes what reaches it (weights
/// observe themselves), then finishes calibration: each such quantizer turns its statistics
/// into quantization parameters and becomes Frozen. Returns how many quantizers were
/// calibrated.
///
/// A model fresh from [`convert_model`](crate::convert::convert_model) has every configured
/// quantizer calibrating; quantizers in other modes are left as they are.
///
/// # Errors
/// The model's forward pass fails on a batch; a calibrating quantizer saw no data (no
/// batches); an observer cannot produce parameters. Each error names the quantizer.
pub fn calibrate<M, X>(model: &mut M, batches: impl IntoIterator<Item = X>) -> Result<usize>
where
    M: QuantizedModule + ModuleMut<X>,
    <M as ModuleMut<X>>::Error: Into<QuantError>,
{
    for x in batches {
        model.try_forward_mut(x).map_err(Into::into)?;
    }
    model.finish_calibration()
}
