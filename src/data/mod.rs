//! Data sets: the training and test samples a model learns from and is measured on.
//!
//! A [`Dataset`] holds two [`Samples`] (flat `f32` features in row-major order, one label per
//! sample, and the shape of one sample). It comes from
//! - the run file's `[data]` section ([`DataSection`], read by [`load`]): the bundled digits,
//!   MNIST's IDX files (gzipped or not: MNIST and Fashion-MNIST as distributed), CSV of any width,
//!   or NumPy `.npy` / `.npz` arrays, with the test split as separate files or a part of the rows,
//!   and scaling (`scale`, then `mean` and `std`);
//! - or code: [`Samples::new`] from plain vectors, [`Samples::from_tensor`] from a dfdx tensor.
//!
//! ```toml
//! [data]
//! format = "idx"                                         # digits, csv, idx, npy or npz
//! images = "data/mnist-10k-images-idx3-ubyte.gz"
//! labels = "data/mnist-10k-labels-idx1-ubyte.gz"
//! test = { from_row = 8000 }                             # or { fraction = 0.2 }, { every = 5 },
//!                                                        # or test_images / test_labels files
//! scale = 255.0                                          # features / scale (IDX's default)
//! mean = 0.1307                                          # then (x - mean) / std
//! std = 0.3081
//! ```
//!
//! Every loader is bounded whatever the file holds: only regular files are read, at most
//! [`MAX_FILE_BYTES`] from disk and after decompression, headers are checked against the file's
//! length before anything is allocated, and a data set holds at most [`MAX_VALUES`] feature
//! values. Errors name the file and, for text, the line.

pub(crate) mod csv;
mod idx;
mod npy;

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use quant_runtime::fs::describe_size;

pub use npy::NpzArrays;

/// Largest data file read, in bytes, on disk and again after decompression (MNIST's training
/// images take 47 MB uncompressed).
pub const MAX_FILE_BYTES: u64 = 256 << 20;
/// Most feature values one data set may hold, train and test together (256 MiB as `f32`;
/// MNIST's 70,000 images hold 55 million).
pub const MAX_VALUES: usize = 64 << 20;
/// Most samples one data set may hold.
pub const MAX_SAMPLES: usize = 4 << 20;
/// Most dimensions of one sample.
pub const MAX_SAMPLE_RANK: usize = 4;

/// Why data could not be loaded, or cannot be used by a model; every variant names the file
/// (or the data set's origin).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// The file could not be opened or read (or is not valid gzip, or not a regular file).
    #[error("cannot read data file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A line of a text file is malformed.
    #[error("{path}, line {line}: {message}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong and what is expected.
        message: String,
    },
    /// A binary file's header or contents are not what its format says (IDX, `.npy`, `.npz`).
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong and what is expected.
        message: String,
    },
    /// The file holds fewer rows than the split needs.
    #[error("{path}: {rows} rows; the digits split needs at least 10 (one test row in 5)")]
    TooSmall {
        /// The file.
        path: PathBuf,
        /// Rows read.
        rows: usize,
    },
    /// The file holds more than a data file may (see the module's limits).
    #[error("{path}: {message}")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Which limit, and its value.
        message: String,
    },
    /// A split the run needs holds no rows (a hold-out fold of a small file, say).
    #[error("{path}: {message}")]
    EmptySplit {
        /// The file.
        path: PathBuf,
        /// Which split, how many rows there are, and what would work.
        message: String,
    },
    /// The `[data]` section is incomplete or contradicts itself.
    #[error("data.{key}: {message}")]
    Config {
        /// The key in `[data]`.
        key: String,
        /// What is wrong and what is valid.
        message: String,
    },
    /// The data does not fit the model (sample shape, label range) or is not usable (values
    /// that are not finite, features and labels of different counts).
    #[error("{origin}: {message}")]
    Unusable {
        /// The data set (its files) or the caller's description.
        origin: String,
        /// What does not fit, and what the model takes.
        message: String,
    },
}

/// Samples of one split: `len × sample_len` features (row-major) and one label per sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Samples {
    features: Vec<f32>,
    labels: Vec<usize>,
    shape: Vec<usize>,
}

impl Samples {
    /// Samples with features `features` (row-major, `labels.len()` samples of `shape`).
    ///
    /// # Errors
    /// The feature count is not `labels.len() × shape` (or overflows), the shape has a zero
    /// dimension or more than [`MAX_SAMPLE_RANK`], or a feature is NaN or infinite.
    pub fn new(features: Vec<f32>, labels: Vec<usize>, shape: &[usize]) -> Result<Self, DataError> {
        let unusable = |message: String| DataError::Unusable {
            origin: "samples".into(),
            message,
        };
        if shape.is_empty() || shape.len() > MAX_SAMPLE_RANK || shape.contains(&0) {
            return Err(unusable(format!(
                "sample shape {shape:?}: expected 1 to {MAX_SAMPLE_RANK} dimensions, none of them 0"
            )));
        }
        let sample_len = shape
            .iter()
            .try_fold(1usize, |a, d| a.checked_mul(*d))
            .ok_or_else(|| unusable(format!("sample shape {shape:?} overflows")))?;
        if labels.len().checked_mul(sample_len) != Some(features.len()) {
            return Err(unusable(format!(
                "{} feature values for {} labels of shape {shape:?}: expected {} values per sample",
                features.len(),
                labels.len(),
                sample_len
            )));
        }
        if let Some(i) = features.iter().position(|v| !v.is_finite()) {
            return Err(unusable(format!(
                "sample {} holds {} at feature {}: features must be finite",
                i / sample_len,
                features[i],
                i % sample_len
            )));
        }
        Ok(Samples {
            features,
            labels,
            shape: shape.to_vec(),
        })
    }

    /// Samples from a dfdx tensor whose first dimension is the batch (`[n, ...]`), and labels.
    ///
    /// # Errors
    /// As [`Samples::new`]; a tensor of rank 1 (no sample dimensions).
    pub fn from_tensor<S: dfdx::shapes::Shape>(
        x: &dfdx::tensor::Tensor<S, f32, dfdx::tensor::Cpu>,
        labels: Vec<usize>,
    ) -> Result<Self, DataError> {
        use dfdx::shapes::HasShape;
        let concrete = x.shape().concrete();
        let dims: &[usize] = concrete.as_ref();
        if dims.len() < 2 {
            return Err(DataError::Unusable {
                origin: "tensor".into(),
                message: format!(
                    "shape {dims:?}: expected [samples, ...] with at least one sample dimension"
                ),
            });
        }
        Samples::new(x.as_vec(), labels, &dims[1..])
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The shape of one sample (`[1, 28, 28]`, `[64]`).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Feature values per sample.
    pub fn sample_len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Every feature value, row-major.
    pub fn features(&self) -> &[f32] {
        &self.features
    }

    /// Every label.
    pub fn labels(&self) -> &[usize] {
        &self.labels
    }

    /// The features of sample `i`.
    pub fn sample(&self, i: usize) -> &[f32] {
        let n = self.sample_len();
        &self.features[i * n..(i + 1) * n]
    }

    /// The samples at `indices`, as (features, labels).
    pub fn gather(&self, indices: &[usize]) -> (Vec<f32>, Vec<usize>) {
        let mut x = Vec::with_capacity(indices.len() * self.sample_len());
        let mut y = Vec::with_capacity(indices.len());
        for &i in indices {
            x.extend_from_slice(self.sample(i));
            y.push(self.labels[i]);
        }
        (x, y)
    }

    /// The samples at `indices`, as new samples of the same shape.
    pub fn subset(&self, indices: &[usize]) -> Samples {
        let (features, labels) = self.gather(indices);
        Samples {
            features,
            labels,
            shape: self.shape.clone(),
        }
    }

    /// The same samples seen with another shape of the same size (`[784]` as `[1, 28, 28]`).
    ///
    /// # Errors
    /// `shape` holds a different number of values per sample.
    pub fn reshaped(mut self, shape: &[usize]) -> Result<Samples, DataError> {
        let n: Option<usize> = shape.iter().try_fold(1usize, |a, d| a.checked_mul(*d));
        if n != Some(self.sample_len()) || shape.is_empty() || shape.len() > MAX_SAMPLE_RANK {
            return Err(DataError::Unusable {
                origin: "samples".into(),
                message: format!(
                    "samples of shape {:?} ({} values) cannot be seen as {shape:?}",
                    self.shape,
                    self.sample_len()
                ),
            });
        }
        self.shape = shape.to_vec();
        Ok(self)
    }

    /// Applies `(x / scale - mean) / std` to every feature.
    fn normalize(&mut self, scale: f64, mean: f64, std: f64) {
        if scale == 1.0 && mean == 0.0 && std == 1.0 {
            return;
        }
        // In f64, rounded once: `x / 255` is the nearest f32 to the exact quotient.
        for v in &mut self.features {
            *v = ((f64::from(*v) / scale - mean) / std) as f32;
        }
    }
}

/// A training split and a test split, with where they came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    /// Training samples (and, unless [`Dataset::calibration`] is set, calibration samples).
    pub train: Samples,
    /// Test samples: every reported accuracy is measured on them.
    pub test: Samples,
    /// Samples to calibrate on, when not the training split (say, a few hundred unlabeled
    /// images with placeholder labels).
    pub calibration: Option<Samples>,
    /// Where the data came from (file names), for reports and errors.
    pub origin: String,
}

impl Dataset {
    /// A data set from its splits.
    ///
    /// # Errors
    /// The splits' sample shapes differ.
    pub fn new(
        train: Samples,
        test: Samples,
        origin: impl Into<String>,
    ) -> Result<Self, DataError> {
        let origin = origin.into();
        if train.shape != test.shape {
            return Err(DataError::Unusable {
                origin,
                message: format!(
                    "training samples of shape {:?} but test samples of shape {:?}",
                    train.shape, test.shape
                ),
            });
        }
        Ok(Dataset {
            train,
            test,
            calibration: None,
            origin,
        })
    }

    /// The shape of one sample.
    pub fn sample_shape(&self) -> &[usize] {
        self.train.shape()
    }

    /// The number of classes the labels need: the largest label + 1 over every split.
    pub fn classes_needed(&self) -> usize {
        [&self.train, &self.test]
            .into_iter()
            .chain(self.calibration.as_ref())
            .flat_map(|s| s.labels.iter())
            .max()
            .map_or(0, |l| l + 1)
    }

    /// Checks that a model taking samples of `shape` and giving `classes` logits can use this
    /// data, and returns it seen with the model's shape (`[784]` as `[1, 28, 28]`).
    ///
    /// # Errors
    /// The sample sizes differ, a label is not below `classes`, or a split has no samples.
    pub fn for_model(mut self, shape: &[usize], classes: usize) -> Result<Dataset, DataError> {
        let unusable = |message: String| DataError::Unusable {
            origin: self.origin.clone(),
            message,
        };
        let model_len: usize = shape.iter().product();
        if model_len != self.train.sample_len() {
            return Err(unusable(format!(
                "samples of shape {:?} ({} values each); the model takes {shape:?} ({model_len} values)",
                self.train.shape,
                self.train.sample_len()
            )));
        }
        for (split, name) in [(&self.train, "training"), (&self.test, "test")]
            .into_iter()
            .chain(self.calibration.as_ref().map(|c| (c, "calibration")))
        {
            if split.is_empty() {
                return Err(unusable(format!(
                    "the {name} split has no samples; a run needs at least one"
                )));
            }
            if let Some((i, l)) = split
                .labels
                .iter()
                .enumerate()
                .find(|(_, l)| **l >= classes)
            {
                return Err(unusable(format!(
                    "{name} sample {i} has label {l}; the model has {classes} classes (labels 0..={})",
                    classes - 1
                )));
            }
        }
        self.train = self.train.reshaped(shape)?;
        self.test = self.test.reshaped(shape)?;
        if let Some(c) = self.calibration.take() {
            self.calibration = Some(c.reshaped(shape)?);
        }
        Ok(self)
    }

    /// Keeps the training rows outside fold `fold` of `folds` (row `i` is held out when
    /// `i % folds == fold`) and evaluates on the held-out rows instead of the test split: for
    /// choosing a recipe without ever reading the test split.
    ///
    /// # Errors
    /// Either part would be empty.
    pub fn holdout(self, h: Holdout) -> Result<Dataset, DataError> {
        let rows = self.train.len();
        let (held, kept): (Vec<usize>, Vec<usize>) =
            (0..rows).partition(|i| i % h.folds.max(1) == h.fold);
        if held.is_empty() || kept.is_empty() {
            return Err(DataError::EmptySplit {
                path: PathBuf::from(&self.origin),
                message: format!(
                    "data.holdout = {{ folds = {}, fold = {} }} leaves {} rows to train on and {} to evaluate on, of the {rows} rows of the training split; both need at least one: use a fold below {} or a larger data file",
                    h.folds,
                    h.fold,
                    kept.len(),
                    held.len(),
                    h.folds.min(rows)
                ),
            });
        }
        Ok(Dataset {
            test: self.train.subset(&held),
            train: self.train.subset(&kept),
            calibration: self.calibration,
            origin: format!("{} (hold-out fold {} of {})", self.origin, h.fold, h.folds),
        })
    }
}

/// `holdout = { folds = 5, fold = 0 }`: training row `i` (0-based, within the training split)
/// is held out when `i % folds == fold`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Holdout {
    /// Number of folds, 2..=20.
    pub folds: usize,
    /// The held-out fold, `0..folds`.
    pub fold: usize,
}

/// The file formats of `[data]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataFormat {
    /// The digits file (`path`): 64 integer pixels `0..=16` and a label per line, gzipped or
    /// not; every fifth row is a test row; features are `pixel / 16`, shape `[1, 8, 8]`.
    Digits,
    /// CSV (`path`, optionally `test_path`): the features, then the label (or the label
    /// first, `label = "first"`), an optional header line (`header = true`).
    Csv,
    /// MNIST's IDX files (`images`, `labels`, optionally `test_images`, `test_labels`),
    /// gzipped or not: unsigned bytes, features scaled by 255 unless `scale` says otherwise.
    Idx,
    /// NumPy `.npy` files (`images`, `labels`, optionally `test_images`, `test_labels`):
    /// `uint8` (scaled by 255 unless `scale` says otherwise) or `float32` features, integer
    /// labels.
    Npy,
    /// A NumPy `.npz` archive (`path`) holding the arrays that `arrays` names (default
    /// `x_train`, `y_train`, `x_test`, `y_test`, Keras' names).
    Npz,
}

impl std::fmt::Display for DataFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DataFormat::Digits => "digits",
            DataFormat::Csv => "csv",
            DataFormat::Idx => "idx",
            DataFormat::Npy => "npy",
            DataFormat::Npz => "npz",
        })
    }
}

/// Where the test split comes from when it has no files of its own.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum TestSplit {
    /// Row `i` is a test row when `i % every == 0` (the digits' split, `every = 5`).
    Every(usize),
    /// The last `fraction` of the rows (rounded down; at least one row each side).
    Fraction(f64),
    /// The rows from this one (0-based) to the end.
    FromRow(usize),
}

/// Which column of a CSV row is the label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LabelColumn {
    /// The last field (features, then the label).
    #[default]
    Last,
    /// The first field (the label, then the features: Kaggle's MNIST CSV).
    First,
}

/// `[data]`: where the samples come from (default: the bundled digits).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    /// The file format; default `digits` with `path`, else taken from the files' names
    /// (`.npz`, `.npy`, IDX's `-ubyte`).
    pub format: Option<DataFormat>,
    /// `digits`, `csv`: the file of rows; `npz`: the archive.
    pub path: Option<PathBuf>,
    /// `csv`: a file of test rows (default: the test rows come from `path`, see `test`).
    pub test_path: Option<PathBuf>,
    /// `idx`, `npy`: the training features.
    pub images: Option<PathBuf>,
    /// `idx`, `npy`: the training labels.
    pub labels: Option<PathBuf>,
    /// `idx`, `npy`: the test features.
    pub test_images: Option<PathBuf>,
    /// `idx`, `npy`: the test labels.
    pub test_labels: Option<PathBuf>,
    /// `npz`: the arrays' names in the archive.
    pub arrays: Option<NpzArrays>,
    /// `csv`: the first line is a header.
    #[serde(default)]
    pub header: bool,
    /// `csv`: which column is the label.
    #[serde(default)]
    pub label: LabelColumn,
    /// The test rows, when the test split has no files of its own: `{ every = 5 }`,
    /// `{ fraction = 0.2 }` or `{ from_row = 8000 }`.
    pub test: Option<TestSplit>,
    /// One sample's shape (`[1, 28, 28]`); default: the file's (IDX, NumPy), else flat.
    /// Models take any shape of the same size.
    pub shape: Option<Vec<usize>>,
    /// Features are divided by `scale` (default 255 for bytes, 16 for digits, else 1)...
    pub scale: Option<f64>,
    /// ... then `mean` is subtracted (default 0)...
    pub mean: Option<f64>,
    /// ... and the result divided by `std` (default 1).
    pub std: Option<f64>,
    /// Development mode for choosing a recipe without the test split: hold out one fold of
    /// the training split, train on the others, and report every figure on the held-out fold
    /// instead of the test split (which is then not read at all).
    pub holdout: Option<Holdout>,
}

impl DataSection {
    /// The files this section reads (for the report and for refusing to overwrite inputs).
    pub fn files(&self) -> Vec<&Path> {
        [
            &self.path,
            &self.test_path,
            &self.images,
            &self.labels,
            &self.test_images,
            &self.test_labels,
        ]
        .into_iter()
        .flatten()
        .map(PathBuf::as_path)
        .collect()
    }

    /// The format, given or taken from the file names.
    ///
    /// # Errors
    /// No format is given and the file names do not say one.
    pub fn resolved_format(&self) -> Result<DataFormat, DataError> {
        if let Some(f) = self.format {
            return Ok(f);
        }
        let name = |p: &Option<PathBuf>| {
            p.as_ref()
                .map(|p| p.to_string_lossy().to_ascii_lowercase())
                .unwrap_or_default()
        };
        let (path, images) = (name(&self.path), name(&self.images));
        if path.ends_with(".npz") {
            Ok(DataFormat::Npz)
        } else if images.ends_with(".npy") {
            Ok(DataFormat::Npy)
        } else if images.contains("-ubyte") || images.contains("idx") {
            Ok(DataFormat::Idx)
        } else if self.path.is_some() && self.images.is_none() {
            Ok(DataFormat::Digits)
        } else {
            Err(config(
                "format",
                "cannot tell the format from the file names: set format = \"digits\", \"csv\", \"idx\", \"npy\" or \"npz\"",
            ))
        }
    }

    /// Checks the section's values (not the files): known combinations, finite positive
    /// scales, a usable split.
    ///
    /// # Errors
    /// The first key that is wrong, with what is valid.
    pub fn validate(&self) -> Result<(), DataError> {
        let only_holdout = DataSection {
            holdout: self.holdout,
            ..DataSection::default()
        };
        if self.files().is_empty() && *self != only_holdout {
            return Err(config(
                "path",
                "settings without a file: name the data file (path, or images and labels)",
            ));
        }
        if self.files().is_empty() {
            return self.validate_holdout();
        }
        let format = self.resolved_format()?;
        let used: &[&str] = match format {
            DataFormat::Digits => &["path"],
            DataFormat::Csv => &["path", "test_path", "header", "label"],
            DataFormat::Idx | DataFormat::Npy => {
                &["images", "labels", "test_images", "test_labels"]
            }
            DataFormat::Npz => &["path", "arrays"],
        };
        let given = [
            ("path", self.path.is_some()),
            ("test_path", self.test_path.is_some()),
            ("images", self.images.is_some()),
            ("labels", self.labels.is_some()),
            ("test_images", self.test_images.is_some()),
            ("test_labels", self.test_labels.is_some()),
            ("arrays", self.arrays.is_some()),
            ("header", self.header),
            ("label", self.label != LabelColumn::Last),
        ];
        for (key, set) in given {
            if set && !used.contains(&key) {
                return Err(config(
                    key,
                    format!(
                        "not a setting of format = \"{format}\", which reads {}",
                        used.join(", ")
                    ),
                ));
            }
        }
        let need = |key: &str, p: &Option<PathBuf>| {
            if p.is_none() {
                Err(config(
                    key,
                    format!("format = \"{format}\" needs this file"),
                ))
            } else {
                Ok(())
            }
        };
        match format {
            DataFormat::Digits | DataFormat::Csv | DataFormat::Npz => need("path", &self.path)?,
            DataFormat::Idx | DataFormat::Npy => {
                need("images", &self.images)?;
                need("labels", &self.labels)?;
                if self.test_images.is_some() != self.test_labels.is_some() {
                    return Err(config(
                        if self.test_images.is_some() {
                            "test_labels"
                        } else {
                            "test_images"
                        },
                        "test_images and test_labels come together",
                    ));
                }
            }
        }
        let test_files = self.test_path.is_some() || self.test_images.is_some();
        match (format, self.test, test_files) {
            (DataFormat::Digits, Some(_), _) => {
                return Err(config(
                    "test",
                    "the digits format has its own split (every fifth row)",
                ))
            }
            (_, Some(_), true) => {
                return Err(config(
                    "test",
                    "the test split comes from its own files here; leave `test` out",
                ))
            }
            (DataFormat::Csv | DataFormat::Idx | DataFormat::Npy, None, false) => {
                return Err(config(
                    "test",
                    "say where the test samples are: test files, or test = { from_row = N }, { fraction = 0.2 } or { every = 5 }",
                ))
            }
            _ => {}
        }
        if format == DataFormat::Digits && self.scale.is_some() {
            return Err(config(
                "scale",
                "the digits format defines its scale (pixel / 16); mean and std still apply",
            ));
        }
        match self.test {
            Some(TestSplit::Every(k)) if k < 2 => {
                return Err(config("test.every", format!("{k}: expected at least 2")))
            }
            Some(TestSplit::Fraction(f)) if !(f > 0.0 && f < 1.0) => {
                return Err(config(
                    "test.fraction",
                    format!("{f}: expected 0 < fraction < 1"),
                ))
            }
            _ => {}
        }
        for (key, v) in [("scale", self.scale), ("std", self.std)] {
            if let Some(v) = v {
                if !(v.is_finite() && v > 0.0 && (1e-30..=1e30).contains(&v)) {
                    return Err(config(
                        key,
                        format!("{v}: expected a positive finite number"),
                    ));
                }
            }
        }
        if let Some(m) = self.mean {
            if !(m.is_finite() && m.abs() <= 1e30) {
                return Err(config("mean", format!("{m}: expected a finite number")));
            }
        }
        if let Some(shape) = &self.shape {
            if shape.is_empty() || shape.len() > MAX_SAMPLE_RANK || shape.contains(&0) {
                return Err(config(
                    "shape",
                    format!(
                        "{shape:?}: expected 1 to {MAX_SAMPLE_RANK} dimensions, none of them 0"
                    ),
                ));
            }
            if format == DataFormat::Digits && shape.iter().product::<usize>() != 64 {
                return Err(config(
                    "shape",
                    format!("{shape:?}: a digits sample holds 64 values"),
                ));
            }
        }
        self.validate_holdout()
    }

    fn validate_holdout(&self) -> Result<(), DataError> {
        if let Some(h) = self.holdout {
            if !(2..=20).contains(&h.folds) {
                return Err(config(
                    "holdout.folds",
                    format!("{}: expected 2..=20", h.folds),
                ));
            }
            if h.fold >= h.folds {
                return Err(config(
                    "holdout.fold",
                    format!("{}: expected 0..{} (below folds)", h.fold, h.folds),
                ));
            }
        }
        Ok(())
    }
}

fn config(key: &str, message: impl Into<String>) -> DataError {
    DataError::Config {
        key: key.into(),
        message: message.into(),
    }
}

/// Loads the data a `[data]` section names (the bundled digits when it names no file); the
/// hold-out fold, if any, replaces the test split.
///
/// # Errors
/// The section is inconsistent ([`DataSection::validate`]); a file cannot be read, is larger
/// than the limits, or is not what its format says; the splits disagree or one is empty.
pub fn load(section: &DataSection) -> Result<Dataset, DataError> {
    section.validate()?;
    // Loaders give raw values and the scale their format implies (255 for bytes); the digits
    // loader gives `pixel / 16` already (its format defines the scale).
    let (mut data, natural_scale) = if section.files().is_empty() {
        (crate::digits::bundled()?, 1.0)
    } else {
        match section.resolved_format()? {
            DataFormat::Digits => {
                let path = section.path.as_deref().unwrap_or_else(|| Path::new(""));
                (crate::digits::load(path)?, 1.0)
            }
            DataFormat::Csv => csv::load(section)?,
            DataFormat::Idx => idx::load(section)?,
            DataFormat::Npy => npy::load_npy(section)?,
            DataFormat::Npz => npy::load_npz(section)?,
        }
    };
    if let Some(shape) = &section.shape {
        data.train = data.train.reshaped(shape)?;
        data.test = data.test.reshaped(shape)?;
    }
    let scale = section.scale.unwrap_or(natural_scale);
    let (mean, std) = (section.mean.unwrap_or(0.0), section.std.unwrap_or(1.0));
    for split in [&mut data.train, &mut data.test] {
        split.normalize(scale, mean, std);
    }
    for split in [&data.train, &data.test] {
        if let Some(i) = split.features.iter().position(|v| !v.is_finite()) {
            return Err(DataError::Unusable {
                origin: data.origin.clone(),
                message: format!(
                    "feature {} of a sample is {} after scaling: check scale, mean and std",
                    i % split.sample_len(),
                    split.features[i]
                ),
            });
        }
    }
    match section.holdout {
        Some(h) => data.holdout(h),
        None => Ok(data),
    }
}

/// Reads a whole data file, decompressing gzip (by its magic bytes), within
/// [`MAX_FILE_BYTES`] on disk and after decompression.
pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>, DataError> {
    let read_err = |source| DataError::Read {
        path: path.to_path_buf(),
        source,
    };
    let (mut file, len) = quant_runtime::fs::open_regular(path).map_err(read_err)?;
    if len > MAX_FILE_BYTES {
        return Err(read_err(quant_runtime::fs::too_large(len, MAX_FILE_BYTES)));
    }
    let mut raw = Vec::with_capacity(len as usize);
    (&mut file)
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut raw)
        .map_err(read_err)?;
    if raw.len() as u64 > MAX_FILE_BYTES {
        return Err(read_err(quant_runtime::fs::too_large(
            raw.len() as u64,
            MAX_FILE_BYTES,
        )));
    }
    if !raw.starts_with(&[0x1f, 0x8b]) {
        return Ok(raw);
    }
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(&raw[..])
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut out)
        .map_err(read_err)?;
    if out.len() as u64 > MAX_FILE_BYTES {
        return Err(DataError::TooLarge {
            path: path.to_path_buf(),
            message: format!(
                "more than {} after decompression; a data file holds at most that",
                describe_size(MAX_FILE_BYTES)
            ),
        });
    }
    Ok(out)
}

/// Splits `all` rows into (train, test) by `split`.
pub(crate) fn split_rows(
    all: Samples,
    split: TestSplit,
    path: &Path,
) -> Result<(Samples, Samples), DataError> {
    let n = all.len();
    let is_test: Box<dyn Fn(usize) -> bool> = match split {
        TestSplit::Every(k) => Box::new(move |i| i % k == 0),
        TestSplit::Fraction(f) => {
            let first = n - ((n as f64 * f).floor() as usize).min(n);
            Box::new(move |i| i >= first)
        }
        TestSplit::FromRow(r) => Box::new(move |i| i >= r),
    };
    let (test, train): (Vec<usize>, Vec<usize>) = (0..n).partition(|i| is_test(*i));
    for (rows, name) in [(&train, "training"), (&test, "test")] {
        if rows.is_empty() {
            return Err(DataError::EmptySplit {
                path: path.to_path_buf(),
                message: format!(
                    "{n} rows, of which {split:?} leaves none for the {name} split; both need at least one"
                ),
            });
        }
    }
    Ok((all.subset(&train), all.subset(&test)))
}

/// Checks that `count` samples of `sample_len` values fit the limits.
pub(crate) fn check_size(count: usize, sample_len: usize, path: &Path) -> Result<(), DataError> {
    let values = count.checked_mul(sample_len);
    if count > MAX_SAMPLES || values.is_none_or(|v| v > MAX_VALUES) {
        return Err(DataError::TooLarge {
            path: path.to_path_buf(),
            message: format!(
                "{count} samples of {sample_len} values; a data set holds at most {MAX_SAMPLES} samples and {MAX_VALUES} values"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
