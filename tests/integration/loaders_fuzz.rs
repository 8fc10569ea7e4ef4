//! The stable, CI-run counterpart of the cargo-fuzz targets under `fuzz/`: proptest feeds
//! arbitrary bytes and strings, and structured mutations of valid files (values replaced by
//! hostile ones, keys dropped, files truncated, bytes flipped, header lengths rewritten), to
//! every loader of user files: the policy file, the run file, the inferable-quantizer JSON, the
//! safetensors header check, the exported model (then prepared for and run by the integer
//! runtime) and the digits data file (plain and gzip). None may panic; every failure is an
//! error value whose message names its origin.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::Value;

use quant::pipeline::RunConfig;
use quant_core::InferableQuantizer;
use quant_dfdx::policy::{ConfigError, Policy};
use quant_runtime::export::{self, QuantFormat};
use quant_runtime::integer::IntegerModel;
use quant_runtime::safetensors::check_safetensors;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every TOML file the project ships: run files and policies.
fn shipped_toml() -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root().join("configs")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "toml") {
                out.push(std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    out.sort();
    assert!(
        out.len() >= 3,
        "configs/ should hold the shipped run files and policies"
    );
    out
}

/// Values a hostile file puts where a valid one has something else.
fn hostile_toml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("-1".to_string()),
        Just("0".to_string()),
        Just("99999999999999999999999".to_string()),
        Just("9223372036854775807".to_string()),
        Just("nan".to_string()),
        Just("-inf".to_string()),
        Just("1e400".to_string()),
        Just("4.5".to_string()),
        Just("\"\"".to_string()),
        Just("\"float\"".to_string()),
        Just("\"Lsq\"".to_string()),
        Just("[]".to_string()),
        Just("{}".to_string()),
        Just("true".to_string()),
        Just("[[[[[[[[[[1]]]]]]]]]]".to_string()),
        Just(format!("\"{}\"", "x".repeat(5000))),
        Just("{ kind = \"Percentile\", bins = 1000000000000 }".to_string()),
        Just("{ alpha = nan }".to_string()),
        Just("\"[\"".to_string()),
        (0u32..100).prop_map(|b| b.to_string()),
        "[a-zA-Z0-9_\" .{}=\\[\\]-]{0,12}",
    ]
}

/// A shipped TOML text with one mutation applied.
fn mutated_toml() -> impl Strategy<Value = String> {
    let texts = shipped_toml();
    (
        0..texts.len(),
        any::<Index>(),
        0u8..5,
        hostile_toml_value(),
        any::<Index>(),
    )
        .prop_map(move |(t, line, how, value, cut)| {
            let text = &texts[t];
            let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
            let i = line
                .index(lines.len().max(1))
                .min(lines.len().saturating_sub(1));
            match how {
                // Replace the value of a `key = value` line.
                0 | 1 => {
                    if let Some((k, _)) = lines.get(i).and_then(|l| l.split_once('=')) {
                        lines[i] = format!("{k}= {value}");
                    } else {
                        lines.insert(i, format!("bits = {value}"));
                    }
                }
                // Drop a line.
                2 => {
                    if !lines.is_empty() {
                        lines.remove(i);
                    }
                }
                // Duplicate a line (duplicate keys and tables).
                3 => {
                    if let Some(l) = lines.get(i).cloned() {
                        lines.insert(i, l);
                    }
                }
                // Truncate the text at a character boundary.
                _ => {
                    let joined = lines.join("\n");
                    let mut at = cut.index(joined.len() + 1);
                    while !joined.is_char_boundary(at) {
                        at -= 1;
                    }
                    return joined[..at].to_string();
                }
            }
            lines.join("\n")
        })
}

/// Checks a loader's outcome: an error names the origin; a parse or validation error names a
/// key path.
fn check_policy_error(e: &ConfigError, origin: &str) {
    let message = e.to_string();
    assert!(message.contains(origin), "{message}");
    match e {
        ConfigError::Parse { key, .. } | ConfigError::Invalid { key, .. } => {
            assert!(!key.is_empty(), "{message}")
        }
        _ => {}
    }
}

fn policy_and_run(text: &str) {
    if let Err(e) = Policy::from_toml_str(text, "fuzz.toml") {
        check_policy_error(&e, "fuzz.toml");
    }
    if let Err(e) = RunConfig::from_toml_str(text, "fuzz-run.toml") {
        check_policy_error(&e, "fuzz-run.toml");
    }
}

// ----- JSON ------------------------------------------------------------------------------------

fn hostile_json_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        Just(serde_json::json!(-1)),
        Just(serde_json::json!(0)),
        Just(serde_json::json!(0.0)),
        Just(serde_json::json!(-0.5)),
        Just(serde_json::json!(1e-45)),
        Just(serde_json::json!(3.4e38)),
        Just(serde_json::json!(1e300)),
        Just(serde_json::json!(u64::MAX)),
        Just(serde_json::json!(i64::MIN)),
        Just(serde_json::json!(2147483648u64)),
        Just(serde_json::json!(1u64 << 40)),
        Just(serde_json::json!("")),
        Just(serde_json::json!("NaN")),
        Just(serde_json::json!([])),
        Just(serde_json::json!([0, 0, 0, 0, 0])),
        Just(serde_json::json!({})),
        Just(serde_json::json!(true)),
        (-300i64..300).prop_map(|v| serde_json::json!(v)),
        (0u32..20).prop_map(|b| serde_json::json!(b)),
        any::<f32>()
            .prop_filter("JSON holds finite numbers", |v| v.is_finite())
            .prop_map(|v| serde_json::json!(v)),
    ]
}

/// Paths (object keys and array indices) to every node of `v`.
fn node_paths(v: &Value, prefix: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    out.push(prefix.clone());
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                prefix.push(Step::Key(k.clone()));
                node_paths(child, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                prefix.push(Step::Index(i));
                node_paths(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

#[derive(Clone, Debug)]
enum Step {
    Key(String),
    Index(usize),
}

fn node_mut<'a>(v: &'a mut Value, path: &[Step]) -> Option<&'a mut Value> {
    let mut cur = v;
    for s in path {
        cur = match s {
            Step::Key(k) => cur.get_mut(k.as_str())?,
            Step::Index(i) => cur.get_mut(*i)?,
        };
    }
    Some(cur)
}

/// `v` with one node replaced by a hostile value, removed (object keys, array elements) or
/// duplicated (array elements).
fn mutate_json(mut v: Value, at: Index, how: u8, value: Value) -> Value {
    let mut paths = Vec::new();
    node_paths(&v, &mut Vec::new(), &mut paths);
    let path = &paths[at.index(paths.len())];
    match (how, path.split_last()) {
        (1, Some((last, parent))) => {
            if let Some(p) = node_mut(&mut v, parent) {
                match (p, last) {
                    (Value::Object(m), Step::Key(k)) => {
                        m.remove(k);
                    }
                    (Value::Array(a), Step::Index(i)) => {
                        a.remove(*i);
                    }
                    _ => {}
                }
            }
        }
        (2, Some((Step::Index(i), parent))) => {
            if let Some(Value::Array(a)) = node_mut(&mut v, parent) {
                let copy = a[*i].clone();
                a.insert(*i, copy);
            }
        }
        _ => {
            if let Some(n) = node_mut(&mut v, path) {
                *n = value;
            }
        }
    }
    v
}

fn valid_inferables() -> Vec<Value> {
    vec![
        serde_json::json!({"method": "Symmetric", "grid": {"bits": 8, "signed": true, "narrow_range": true},
            "rounding": "HalfEven", "qparams": {"scales": [0.5], "zero_points": [0], "axis": null}}),
        serde_json::json!({"method": "Uniform", "grid": {"bits": 4, "signed": false},
            "rounding": "Floor", "qparams": {"scales": [0.1, 0.2, 0.3], "zero_points": [3, 0, 15], "axis": 1}}),
        serde_json::json!({"method": "PowerOfTwo", "grid": {"bits": 2, "signed": true},
            "qparams": {"scales": [0.25, 2.0], "zero_points": [0, 0], "axis": 0}}),
    ]
}

/// Whatever loads must behave: quantize/dequantize on a tensor of its channel layout.
fn exercise_inferable(q: &InferableQuantizer) {
    let channels = q.qparams().channels();
    let shape: Vec<usize> = match q.qparams().axis() {
        None => vec![5],
        Some(axis) => {
            let mut s = vec![2; axis.min(3) + 1];
            if axis > 3 {
                // Too many dimensions for this check: the layout error is the expected answer.
                assert!(q.quantize::<i32>(&[0.0; 4], &[2, 2]).is_err());
                return;
            }
            s[axis] = channels;
            s
        }
    };
    let n: usize = shape.iter().product();
    let x: Vec<f32> = (0..n).map(|i| (i as f32 - 3.0) * 0.37).collect();
    let codes: Vec<i32> = q.quantize(&x, &shape).unwrap();
    let g = q.grid();
    assert!(codes
        .iter()
        .all(|c| *c >= g.quant_min() && *c <= g.quant_max()));
    let y = q.dequantize(&codes, &shape).unwrap();
    assert_eq!(y, q.fake_quantize(&x, &shape).unwrap());
    let json = serde_json::to_string(q).unwrap();
    assert_eq!(
        &serde_json::from_str::<InferableQuantizer>(&json).unwrap(),
        q
    );
}

fn inferable_bytes(bytes: &[u8]) {
    match serde_json::from_slice::<InferableQuantizer>(bytes) {
        Ok(q) => exercise_inferable(&q),
        // A rejection says where: a syntax error its line and column, a value the format
        // refuses the key that holds it. Never an I/O error.
        Err(e) => {
            use serde_json::error::Category;
            let names_a_key = [
                "method",
                "grid",
                "bits",
                "signed",
                "narrow_range",
                "rounding",
                "qparams",
                "scales",
                "zero_points",
                "axis",
            ]
            .iter()
            .any(|key| e.to_string().contains(key));
            match e.classify() {
                Category::Syntax | Category::Eof => assert!(e.line() > 0, "{e}"),
                Category::Data => assert!(e.line() > 0 || names_a_key, "{e}"),
                Category::Io => panic!("{e}"),
            }
        }
    }
}

// ----- exports ---------------------------------------------------------------------------------

fn corpus_export(name: &str) -> (Value, Vec<u8>) {
    let dir = root()
        .join("tests")
        .join("hostile")
        .join("export")
        .join(name);
    let meta = serde_json::from_slice(&std::fs::read(dir.join("model.json")).unwrap()).unwrap();
    (meta, std::fs::read(dir.join("model.safetensors")).unwrap())
}

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("quant-fuzz-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

/// Loads the files, prepares the integer model and runs two samples through it: every step
/// either fails with an error naming a file or layer, or produces finite logits.
fn export_files(dir: &Path, meta: &[u8], tensors: &[u8]) {
    std::fs::write(dir.join("model.json"), meta).unwrap();
    std::fs::write(dir.join("model.safetensors"), tensors).unwrap();
    let model = match export::load(dir) {
        Ok(m) => m,
        Err(e) => {
            let m = e.to_string();
            assert!(
                m.contains("model.json") || m.contains("model.safetensors"),
                "{m}"
            );
            return;
        }
    };
    let integer = match IntegerModel::new(&model) {
        Ok(i) => i,
        Err(e) => {
            let m = e.to_string();
            assert!(m.contains("layer `"), "{m}");
            return;
        }
    };
    if integer.macs_per_sample() > 1 << 22 {
        return;
    }
    let x: Vec<f32> = (0..2 * integer.input_features())
        .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.21)
        .collect();
    let logits = integer.forward(&x).unwrap();
    assert_eq!(logits.len(), 2 * integer.output_features());
    assert!(logits.iter().all(|v| v.is_finite()), "{logits:?}");
}

fn mutate_bytes(mut b: Vec<u8>, how: u8, at: Index, value: u64, len: Index) -> Vec<u8> {
    match how {
        0 => b.truncate(len.index(b.len() + 1)),
        1 => {
            if !b.is_empty() {
                let i = at.index(b.len());
                b[i] ^= (value as u8).max(1);
            }
        }
        2 => {
            if b.len() >= 8 {
                b[..8].copy_from_slice(&value.to_le_bytes());
            }
        }
        _ => {
            let i = at.index(b.len() + 1);
            let extra = value.to_le_bytes();
            b.splice(i..i, extra[..len.index(9)].iter().copied());
        }
    }
    b
}

// ----- data files ------------------------------------------------------------------------------

/// Loads `bytes` as the data file `name` (gzip when it ends in `.gz`): it loads, with pixels in
/// `[0, 1]` and labels below 10, or fails with an error naming the file.
fn data_file(dir: &Path, name: &str, bytes: &[u8]) {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    match quant::digits::load(&path) {
        Ok(d) => {
            for split in [&d.train, &d.test] {
                assert_eq!(split.features().len(), split.len() * 64);
                assert!(split.features().iter().all(|v| (0.0..=1.0).contains(v)));
                assert!(split.labels().iter().all(|l| *l < 10));
            }
        }
        Err(e) => assert!(e.to_string().contains(name), "{e}"),
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

/// A safetensors header written by hand: any dtype name, shape and offsets.
/// A header entry: name, dtype, shape, data offsets.
type HeaderEntry = (String, String, Vec<u64>, (u64, u64));

fn header_entry() -> impl Strategy<Value = HeaderEntry> {
    (
        prop_oneof![Just("w".to_string()), Just("b".to_string()), "[a-z]{1,3}"],
        prop_oneof![
            Just("I8".to_string()),
            Just("U8".to_string()),
            Just("I32".to_string()),
            Just("F32".to_string()),
            Just("F64".to_string()),
            Just("Q4".to_string()),
        ],
        prop::collection::vec(
            prop_oneof![0u64..5, Just(u64::MAX), Just(1 << 32), Just(1 << 62)],
            0..4,
        ),
        (
            prop_oneof![0u64..40, Just(u64::MAX)],
            prop_oneof![0u64..40, Just(u64::MAX), Just(u64::MAX - 7)],
        ),
    )
}

/// A safetensors file of `entries` (name, dtype, shape, data offsets), `pad` spaces after the
/// header, and `data_len` data bytes.
fn safetensors_file(entries: &[HeaderEntry], data_len: usize, pad: usize) -> Vec<u8> {
    let header: serde_json::Map<String, Value> = entries
        .iter()
        .map(|(n, d, s, (a, b))| {
            let entry = serde_json::json!({"dtype": d, "shape": s, "data_offsets": [a, b]});
            (n.clone(), entry)
        })
        .collect();
    let text = format!("{}{}", Value::Object(header), " ".repeat(pad));
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(text.as_bytes());
    bytes.extend(std::iter::repeat_n(7u8, data_len));
    bytes
}

/// Our check against the format: what passes it, safetensors accepts and slices as we do;
/// what it rejects, safetensors rejects (or panics on: safetensors 0.3 adds offsets unchecked,
/// so a debug build panics on an end offset near 2^64, which is why every loader runs the
/// check first).
fn check_agrees_with_safetensors(bytes: &[u8]) -> Result<(), String> {
    match check_safetensors(bytes) {
        Ok(h) => {
            let st = safetensors::SafeTensors::deserialize(bytes)
                .map_err(|e| format!("safetensors rejects a header the check accepts: {e}"))?;
            for name in h.tensors.keys() {
                let t = st.tensor(name).map_err(|e| format!("{name}: {e}"))?;
                if Some(t.data()) != h.data(bytes, name) {
                    return Err(format!("{name}: the check slices other bytes"));
                }
            }
            Ok(())
        }
        Err(m) => {
            let rejected =
                std::panic::catch_unwind(|| safetensors::SafeTensors::deserialize(bytes).is_err())
                    .unwrap_or(true);
            if rejected {
                Ok(())
            } else {
                Err(format!("rejected a header safetensors accepts: {m}"))
            }
        }
    }
}

/// A case the property test found: an `I8` tensor of `2^64 - 1` elements ending at byte
/// `2^64 - 1` of an empty data section, which safetensors 0.3 overflows on.
#[test]
fn a_tensor_ending_at_the_last_u64_offset_is_rejected() {
    let entry = (
        "w".to_string(),
        "I8".to_string(),
        vec![u64::MAX],
        (0, u64::MAX),
    );
    let bytes = safetensors_file(&[entry], 0, 0);
    assert!(check_safetensors(&bytes).is_err());
    check_agrees_with_safetensors(&bytes).unwrap();
}

/// 256 cases each in CI; `QUANT_FUZZ_CASES=20000 cargo test --test loaders_fuzz` for a longer run.
fn cases() -> u32 {
    std::env::var("QUANT_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_through_the_policy_and_run_loaders(text in "\\PC{0,200}") {
        policy_and_run(&text);
    }

    #[test]
    fn toml_token_soup_through_the_policy_and_run_loaders(
        text in "([\\[\\]{}=\\.,\"'#\\n a-z0-9_+-]|weights|input|bits|training_method|overrides|pattern|platform|nan|inf){0,60}",
    ) {
        policy_and_run(&text);
    }

    #[test]
    fn mutated_shipped_configs_through_the_policy_and_run_loaders(text in mutated_toml()) {
        policy_and_run(&text);
    }

    #[test]
    fn arbitrary_bytes_through_the_inferable_json_loader(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        inferable_bytes(&bytes);
    }

    #[test]
    fn mutated_inferable_json(
        which in 0usize..3,
        at in any::<Index>(),
        how in 0u8..4,
        value in hostile_json_value(),
    ) {
        let v = mutate_json(valid_inferables()[which].clone(), at, how, value);
        inferable_bytes(serde_json::to_string(&v).unwrap().as_bytes());
    }

    #[test]
    fn arbitrary_bytes_through_the_safetensors_check(bytes in prop::collection::vec(any::<u8>(), 0..120)) {
        if check_safetensors(&bytes).is_ok() {
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            for name in st.names() {
                st.tensor(name).unwrap();
            }
        }
    }

    #[test]
    fn hand_written_safetensors_headers(
        entries in prop::collection::vec(header_entry(), 0..4),
        data_len in 0usize..48,
        pad in 0usize..3,
    ) {
        let bytes = safetensors_file(&entries, data_len, pad);
        if let Err(e) = check_agrees_with_safetensors(&bytes) {
            prop_assert!(false, "{}", e);
        }
    }

    #[test]
    fn mutated_export_metadata(
        cnn in any::<bool>(),
        at in any::<Index>(),
        how in 0u8..4,
        value in hostile_json_value(),
    ) {
        let scratch = Scratch::new(if cnn { "meta-cnn" } else { "meta-mlp" });
        let (meta, tensors) = corpus_export(if cnn { "valid_cnn" } else { "valid" });
        let meta = mutate_json(meta, at, how, value);
        export_files(&scratch.0, serde_json::to_string(&meta).unwrap().as_bytes(), &tensors);
    }

    #[test]
    fn mutated_export_tensors(
        cnn in any::<bool>(),
        how in 0u8..4,
        at in any::<Index>(),
        value in any::<u64>(),
        len in any::<Index>(),
    ) {
        let scratch = Scratch::new(if cnn { "st-cnn" } else { "st-mlp" });
        let (meta, tensors) = corpus_export(if cnn { "valid_cnn" } else { "valid" });
        let tensors = mutate_bytes(tensors, how, at, value, len);
        export_files(&scratch.0, serde_json::to_string(&meta).unwrap().as_bytes(), &tensors);
    }

    #[test]
    fn mutated_data_files(
        how in 0u8..4,
        at in any::<Index>(),
        value in any::<u64>(),
        len in any::<Index>(),
        compressed in any::<bool>(),
    ) {
        let valid = std::fs::read(root().join("tests/hostile/data/crlf.csv")).unwrap();
        let scratch = Scratch::new("data");
        let bytes = mutate_bytes(valid, how, at, value, len);
        if compressed {
            // Mutate the gzip stream too, half the time.
            let gz = gzip(&bytes);
            let gz = if value % 2 == 0 { mutate_bytes(gz, how, at, value / 2, len) } else { gz };
            data_file(&scratch.0, "mutated.csv.gz", &gz);
        } else {
            data_file(&scratch.0, "mutated.csv", &bytes);
        }
    }

    #[test]
    fn arbitrary_bytes_as_data_files(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let scratch = Scratch::new("data-bytes");
        data_file(&scratch.0, "bytes.csv", &bytes);
        data_file(&scratch.0, "bytes.csv.gz", &bytes);
    }

    #[test]
    fn arbitrary_bytes_as_export_files(
        meta in prop::collection::vec(any::<u8>(), 0..64),
        tensors in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let scratch = Scratch::new("bytes");
        export_files(&scratch.0, &meta, &tensors);
    }
}

#[test]
fn the_valid_controls_load_run_and_survive_a_round_trip() {
    for name in ["valid", "valid_cnn"] {
        let dir = root()
            .join("tests")
            .join("hostile")
            .join("export")
            .join(name);
        let model = export::load(&dir).unwrap();
        let integer = IntegerModel::new(&model).unwrap();
        assert!(integer.macs_per_sample() > 0);
        let scratch = Scratch::new(&format!("round-trip-{name}"));
        let out = scratch.0.join("export");
        export::save(&model, &out, &[&QuantFormat]).unwrap();
        assert_eq!(export::load(&out).unwrap(), model);
    }
}
