//! Every `[data]` format on small files written here, the splits, scaling and the checks
//! against a model. Hostile files are in `tests/hostile/data/` (`tests/integration/hostile.rs`).

use std::io::Write;
use std::path::{Path, PathBuf};

use super::idx::tests::idx;
use super::npy::tests::npy;
use super::*;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("quant-data-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn section(toml_text: &str) -> DataSection {
    toml::from_str(toml_text).unwrap()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p.display().to_string()
}

/// 10 images of 2x3 bytes (`i * 6 + k`) and labels `i % 3`.
fn idx_files(dir: &Path, gzip: bool) -> (String, String) {
    let pixels: Vec<u8> = (0..60u8).collect();
    let labels: Vec<u8> = (0..10u8).map(|i| i % 3).collect();
    let (x, y) = (idx(&[10, 2, 3], &pixels), idx(&[10], &labels));
    let (x, y, ext) = if gzip {
        (gz(&x), gz(&y), ".gz")
    } else {
        (x, y, "")
    };
    (
        write(dir, &format!("images-idx3-ubyte{ext}"), &x),
        write(dir, &format!("labels-idx1-ubyte{ext}"), &y),
    )
}

#[test]
fn idx_files_gzipped_or_not_split_by_rows_and_scale_by_255() {
    let dir = scratch("idx");
    for gzip in [false, true] {
        let (x, y) = idx_files(&dir, gzip);
        let d = load(&section(&format!(
            "images = '{x}'\nlabels = '{y}'\ntest = {{ from_row = 8 }}"
        )))
        .unwrap();
        assert_eq!((d.train.len(), d.test.len()), (8, 2));
        assert_eq!(d.train.shape(), &[2, 3]);
        assert_eq!(d.test.labels(), &[2, 0]);
        assert_eq!(d.test.sample(0)[0], 48.0 / 255.0);
        assert_eq!(d.classes_needed(), 3);
    }
    // A test split of its own files, mean and std.
    let (x, y) = idx_files(&dir, true);
    let d = load(&section(&format!(
        "format = 'idx'\nimages = '{x}'\nlabels = '{y}'\ntest_images = '{x}'\ntest_labels = '{y}'\nscale = 1.0\nmean = 1.0\nstd = 2.0"
    )))
    .unwrap();
    assert_eq!((d.train.len(), d.test.len()), (10, 10));
    assert_eq!(d.train.sample(1)[0], (6.0 - 1.0) / 2.0);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn csv_of_any_width_with_header_label_first_and_fraction() {
    let dir = scratch("csv");
    let rows: String = (0..10)
        .map(|i| format!("{},{},{}.5,{}\n", i % 4, i, i * 2, i * 3))
        .collect();
    let p = write(&dir, "first.csv", format!("label,a,b,c\n{rows}").as_bytes());
    let d = load(&section(&format!(
        "format = 'csv'\npath = '{p}'\nheader = true\nlabel = 'first'\ntest = {{ fraction = 0.2 }}\nshape = [3, 1]"
    )))
    .unwrap();
    assert_eq!((d.train.len(), d.test.len()), (8, 2));
    assert_eq!(d.train.shape(), &[3, 1]);
    assert_eq!(d.test.sample(0), &[8.0, 16.5, 24.0]);
    assert_eq!(d.test.labels(), &[0, 1]);
    // Features then the label, gzipped, every third row a test row, a separate test file.
    let last: String = (0..9).map(|i| format!("{i},{}\n", i % 2)).collect();
    let p = write(&dir, "last.csv.gz", &gz(last.as_bytes()));
    let d = load(&section(&format!(
        "format = 'csv'\npath = '{p}'\ntest = {{ every = 3 }}"
    )))
    .unwrap();
    assert_eq!(d.test.features(), &[0.0, 3.0, 6.0]);
    let t = write(&dir, "test.csv", b"5,1\n");
    let d = load(&section(&format!(
        "format = 'csv'\npath = '{p}'\ntest_path = '{t}'"
    )))
    .unwrap();
    assert_eq!((d.train.len(), d.test.len()), (9, 1));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn npy_and_npz_arrays() {
    let dir = scratch("npy");
    let x: Vec<u8> = (0..24).collect();
    let y: Vec<u8> = (0..4i64).flat_map(|l| l.to_le_bytes()).collect();
    let xf: Vec<u8> = (0..24)
        .flat_map(|v| (v as f32 * 0.5).to_le_bytes())
        .collect();
    let xp = write(&dir, "x.npy", &npy("|u1", &[4, 2, 3], &x));
    let xfp = write(&dir, "xf.npy", &npy("<f4", &[4, 6], &xf));
    let yp = write(&dir, "y.npy", &npy("<i8", &[4], &y));
    let d = load(&section(&format!(
        "images = '{xp}'\nlabels = '{yp}'\ntest = {{ every = 2 }}"
    )))
    .unwrap();
    assert_eq!(d.train.shape(), &[2, 3]);
    assert_eq!(d.test.labels(), &[0, 2]);
    assert_eq!(d.train.sample(0)[1], 7.0 / 255.0);
    let d = load(&section(&format!(
        "images = '{xfp}'\nlabels = '{yp}'\ntest_images = '{xfp}'\ntest_labels = '{yp}'"
    )))
    .unwrap();
    assert_eq!(d.test.sample(3)[5], 11.5);

    // An archive as numpy.savez_compressed writes it, with Keras' names, and one with its own.
    let npz = |names: [&str; 4], method| {
        let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let opts = zip::write::SimpleFileOptions::default().compression_method(method);
        for (name, bytes) in names.iter().zip([
            npy("|u1", &[4, 2, 3], &x),
            npy("<i8", &[4], &y),
            npy("|u1", &[1, 2, 3], &x[..6]),
            npy("<i8", &[1], &y[..8]),
        ]) {
            w.start_file(format!("{name}.npy"), opts).unwrap();
            w.write_all(&bytes).unwrap();
        }
        w.finish().unwrap().into_inner()
    };
    let p = write(
        &dir,
        "keras.npz",
        &npz(
            ["x_train", "y_train", "x_test", "y_test"],
            zip::CompressionMethod::Deflated,
        ),
    );
    let d = load(&section(&format!("path = '{p}'"))).unwrap();
    assert_eq!((d.train.len(), d.test.len()), (4, 1));
    let p = write(
        &dir,
        "own.npz",
        &npz(["a", "b", "c", "d"], zip::CompressionMethod::Stored),
    );
    let e = load(&section(&format!("path = '{p}'")))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no `x_train.npy`"), "{e}");
    let d = load(&section(&format!(
        "path = '{p}'\narrays = {{ images = 'a', labels = 'b', test_images = 'c', test_labels = 'd' }}"
    )))
    .unwrap();
    assert_eq!(d.test.labels(), &[0]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_model_decides_the_shape_and_the_classes() {
    let d = crate::digits::bundled().unwrap();
    let flat = d.clone().for_model(&[64], 10).unwrap();
    assert_eq!(flat.train.shape(), &[64]);
    let image = d.clone().for_model(&[1, 8, 8], 10).unwrap();
    assert_eq!(image.test.shape(), &[1, 8, 8]);
    let e = d
        .clone()
        .for_model(&[1, 28, 28], 10)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the model takes [1, 28, 28] (784 values)"),
        "{e}"
    );
    let e = d.for_model(&[64], 5).unwrap_err().to_string();
    assert!(e.contains("has label") && e.contains("5 classes"), "{e}");
}

#[test]
fn inconsistent_sections_name_their_key() {
    for (text, want) in [
        ("images = 'a-ubyte'", "data.labels"),
        ("format = 'csv'\npath = 'a.csv'", "data.test: say where"),
        (
            "format = 'csv'\npath = 'a.csv'\ntest = { every = 1 }",
            "data.test.every",
        ),
        (
            "format = 'csv'\npath = 'a.csv'\ntest = { fraction = 1.5 }",
            "data.test.fraction",
        ),
        ("path = 'd.csv'\nscale = 2.0", "data.scale"),
        (
            "path = 'd.csv'\ntest = { every = 5 }",
            "data.test: the digits format",
        ),
        ("format = 'idx'\npath = 'x'", "data.path: not a setting"),
        (
            "format = 'csv'\npath = 'a.csv'\ntest_path = 'b.csv'\ntest = { every = 2 }",
            "its own files",
        ),
        (
            "format = 'csv'\npath = 'a.csv'\ntest = { every = 2 }\nstd = 0.0",
            "data.std",
        ),
        (
            "format = 'csv'\npath = 'a.csv'\ntest = { every = 2 }\nshape = [0, 3]",
            "data.shape",
        ),
        ("scale = 3.0", "data.path: settings without a file"),
        ("images = 'x.bin'\nlabels = 'y.bin'", "data.format"),
    ] {
        let e = section(text).validate().unwrap_err().to_string();
        assert!(e.contains(want), "{text}: {e} (wanted {want})");
    }
    assert!(toml::from_str::<DataSection>("colour = 1").is_err());
}

#[test]
fn a_gzip_bomb_stops_at_the_limit_and_a_huge_header_allocates_nothing() {
    let dir = scratch("bomb");
    // 300 MB of zeros after an IDX header claiming 300 MB of images: about 300 KB of gzip.
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(&[0, 0, 8, 3]).unwrap();
    for d in [375_000u32, 28, 28] {
        e.write_all(&d.to_be_bytes()).unwrap();
    }
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..300 {
        e.write_all(&zeros).unwrap();
    }
    let bomb = write(&dir, "bomb-idx3-ubyte.gz", &e.finish().unwrap());
    let (_, y) = idx_files(&dir, false);
    let e = load(&section(&format!(
        "images = '{bomb}'\nlabels = '{y}'\ntest = {{ from_row = 8 }}"
    )))
    .unwrap_err();
    assert!(matches!(e, DataError::TooLarge { .. }), "{e}");
    assert!(e.to_string().contains("after decompression"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}
