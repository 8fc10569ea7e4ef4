//! Classifies samples with an exported integer model, depending on quant-runtime alone (no
//! dfdx, no training stack).
//!
//! ```text
//! cargo run --release -p quant-runtime --example classify -- <export dir> <samples.csv>
//! ```
//!
//! `samples.csv` holds one sample per line: the model's input features, comma-separated, in
//! the order the model reads them (for the bundled digits, 64 pixel values in 0..=16 scaled to
//! 0..=1; a trailing label column is ignored when the line has one value more than the model
//! takes). Prints the class of each sample, and the accuracy when labels are present.

use std::path::PathBuf;
use std::process::ExitCode;

use quant_runtime::export;
use quant_runtime::integer::IntegerModel;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args_os().skip(1);
    let (Some(dir), Some(samples)) = (args.next(), args.next()) else {
        return Err("usage: classify <export dir> <samples.csv>".into());
    };
    let (dir, samples) = (PathBuf::from(dir), PathBuf::from(samples));
    let graph = export::load(&dir)?;
    let model = IntegerModel::new(&graph)?;
    let features: usize = graph.input.shape.iter().product();
    // Read through quant-runtime's size-limited reader: a user's file, at most 256 MiB.
    let text = quant_runtime::fs::read_text_limited(&samples, 256 << 20)
        .map_err(|e| format!("{}: {e}", samples.display()))?;
    let (mut x, mut labels) = (Vec::new(), Vec::new());
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let values: Vec<f32> = line
            .split(',')
            .map(|v| v.trim().parse::<f32>())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{} line {}: {e}", samples.display(), n + 1))?;
        match values.len() {
            l if l == features => x.extend(values),
            l if l == features + 1 => {
                labels.push(values[features] as usize);
                x.extend(&values[..features]);
            }
            l => {
                return Err(format!(
                    "{} line {}: {l} values; the model takes {features} (and an optional label)",
                    samples.display(),
                    n + 1
                )
                .into())
            }
        }
    }
    let classes = model.predict(&x)?;
    for c in &classes {
        println!("{c}");
    }
    if labels.len() == classes.len() && !labels.is_empty() {
        let right = labels.iter().zip(&classes).filter(|(a, b)| a == b).count();
        eprintln!(
            "accuracy {:.2}% on {} samples",
            100.0 * right as f64 / labels.len() as f64,
            labels.len()
        );
    }
    Ok(())
}
