//! Issue 22, sensitivity analysis: a planted bad slot ranks first, the ranking does not depend
//! on the thread count, and `quant analyze` writes its table, JSON and plot (or, on bad
//! outputs, nothing).

use std::path::PathBuf;
use std::process::Command;

use quant::pipeline::sensitivity::{
    analyze, Analysis, AnalyzeRequest, PrecisionBudget, Raise, Resource,
};
use quant::pipeline::{RunConfig, RunOptions};

/// The digits MLP, 8-bit everywhere but the middle Linear's weights: 2 bits, per tensor,
/// MinMax (the planted bad slot).
const PLANTED: &str = r#"
[model]
kind = "mlp"
[run]
seeds = [0]
[float]
epochs = 4
[calibration]
batches = 4
[quantization.weights]
training_method = "Lsq"
method = "Symmetric"
bits = 8
per_channel = true
observer = "Mse"
[quantization.input]
training_method = "Lsq"
method = "Uniform"
bits = 8
observer = "Mse"
[[quantization.overrides]]
pattern = "2"
weights = { bits = 2, per_channel = false, observer = "MinMax" }
"#;

fn planted() -> RunConfig {
    RunConfig::from_toml_str(PLANTED, "planted.toml").unwrap()
}

fn analyze_with_threads(threads: usize) -> Analysis {
    analyze_on(threads, &planted(), &AnalyzeRequest::default())
}

/// `quant analyze` of `cfg` on a pool of `threads` threads.
fn analyze_on(threads: usize, cfg: &RunConfig, request: &AnalyzeRequest) -> Analysis {
    // A run file is not shared between threads (its policy records what it matched): the pool
    // gets its own copy.
    let (cfg, request) = (cfg.clone(), request.clone());
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(move || analyze(&cfg, &RunOptions::default(), &request).unwrap())
}

#[test]
fn a_planted_bad_slot_ranks_first_whatever_the_thread_count() {
    let one = analyze_with_threads(1);
    let m = &one.mean;
    // Every slot of the three Linear layers, measured on the hold-out fold (a fifth of the
    // training rows), not the test split.
    assert_eq!(m.slots.len(), 6, "{}", one.table());
    assert!(one.data.contains("hold-out fold 0 of 5"), "{}", one.data);
    let training_rows = quant::digits::bundled().unwrap().train.len();
    assert_eq!(m.rows, training_rows.div_ceil(5));
    assert_eq!(m.slots[0].slot, "2.weights", "{}", one.table());
    // Alone it costs more than every other slot; without it the model is far closer to float.
    let bad = &m.slots[0];
    assert!(m.slots[1..]
        .iter()
        .all(|s| s.alone.sqnr_db > bad.alone.sqnr_db + 6.0));
    assert!(
        bad.all_but.sqnr_db > m.quantized.sqnr_db + 6.0,
        "{}",
        one.table()
    );
    assert!(bad.all_but.accuracy >= m.quantized.accuracy);
    // Bit for bit the same on two threads.
    assert_eq!(analyze_with_threads(2), one);
    // The plot names every slot, in rank order.
    let svg = one.svg();
    let at = |name: &str| svg.find(&format!(">{name}<")).unwrap();
    assert!(at("2.weights") < at(&m.slots[1].slot));
}

/// Learned rounding and bias correction write the refined layers' weights and biases: a slot
/// measured with a layer left float must see that layer's float weights, not its learned codes.
#[test]
fn slots_left_float_see_the_float_layers_after_learned_rounding() {
    let refined_text = PLANTED.replace(
        "observer = \"Mse\"\n[quantization.input]",
        "observer = \"Mse\"\nlearned_rounding = \"AdaRound\"\nbias_correction = true\n\
         [quantization.input]",
    ) + "[quantization.adaround]\niterations = 200\n";
    let refined = RunConfig::from_toml_str(&refined_text, "refined.toml").unwrap();
    let options = RunOptions::default();
    let with = analyze(&refined, &options, &AnalyzeRequest::default()).unwrap();
    let without = analyze(&planted(), &options, &AnalyzeRequest::default()).unwrap();
    let nearest = |slot: &str| without.mean.slots.iter().find(|s| s.slot == slot).unwrap();
    // The refined model is another model: learned rounding changed what it computes.
    assert_ne!(
        with.mean.quantized,
        without.mean.quantized,
        "{}",
        with.table()
    );
    for s in &with.mean.slots {
        if s.slot_name == "input" {
            // Alone, an input slot quantizes on float layers whatever their weights would
            // round to (its grid is calibrated before refinement): as without refinement.
            assert_eq!(s.alone, nearest(&s.slot).alone, "{}", s.slot);
        } else {
            // Alone, a refined weights slot is its layer's learned codes: another error than
            // nearest rounding's.
            assert_ne!(s.alone, nearest(&s.slot).alone, "{}", s.slot);
        }
    }
}

/// Every weight at 2 bits per tensor (MinMax): PTQ falls well below float.
fn harsh() -> RunConfig {
    let text = PLANTED
        .replace(
            "bits = 8\nper_channel = true",
            "bits = 2\nper_channel = false",
        )
        .replace(
            "observer = \"Mse\"\n[quantization.input]",
            "observer = \"MinMax\"\n[quantization.input]",
        );
    RunConfig::from_toml_str(&text, "harsh.toml").unwrap()
}

#[test]
fn the_fallback_leaves_the_fewest_slots_float_and_its_policy_reproduces_it() {
    let cfg = harsh();
    let a = analyze(&cfg, &RunOptions::default(), &drop_of(0.5)).unwrap();
    let f = a.fallback.as_ref().unwrap();
    let drop = |acc: f64| 100.0 * (a.mean.float_accuracy - acc);
    assert!(drop(a.mean.quantized.accuracy) > 0.5, "{}", a.table());
    assert!(f.met && drop(f.accuracy) <= 0.5 + 1e-9, "{}", a.table());
    assert!(
        !f.raised.is_empty() && f.raised.len() < f.slots,
        "{}",
        a.table()
    );
    // The fewest: the most sensitive slots, in order, one fewer would not do.
    let ranked: Vec<&str> = a.mean.slots.iter().map(|s| s.slot.as_str()).collect();
    assert_eq!(f.raised, ranked[..f.raised.len()]);
    let mut fewer = cfg.clone();
    fewer.quantization = f.policy.clone();
    fewer.quantization.overrides.pop();
    let fewer = analyze(&fewer, &RunOptions::default(), &AnalyzeRequest::default()).unwrap();
    assert!(
        drop(fewer.mean.quantized.accuracy) > 0.5,
        "{}",
        fewer.table()
    );
    // The policy file, read back, gives the same PTQ model: the same accuracy.
    let text = toml::to_string(&f.policy).unwrap();
    let mut again = cfg.clone();
    again.quantization = quant::policy::Policy::from_toml_str(&text, "fallback.toml").unwrap();
    let again = analyze(&again, &RunOptions::default(), &AnalyzeRequest::default()).unwrap();
    assert_eq!(again.mean.quantized.accuracy, f.accuracy, "{text}");
    // A drop that is not a number of points is refused before anything trains.
    for bad in [-0.1, f64::NAN, f64::INFINITY, 101.0] {
        let e = analyze(&cfg, &RunOptions::default(), &drop_of(bad))
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_drop"), "{e}");
    }
}

/// The seeds run in parallel, and so do the search's and the fallback's measurements (every
/// seed under every policy measured): two seeds with a budget and a drop give the same
/// analysis on one thread and on two, bit for bit.
#[test]
fn parallel_seeds_searches_and_fallbacks_do_not_change_the_analysis() {
    let mut cfg = harsh();
    cfg.run.seeds = vec![0, 1];
    let request = AnalyzeRequest {
        max_drop: Some(0.5),
        ..budget_of(Resource::Weights, 4.0, &[2, 4, 8])
    };
    let one = analyze_on(1, &cfg, &request);
    assert_eq!(one.runs.len(), 2);
    let (f, m) = (
        one.fallback.as_ref().unwrap(),
        one.mixed_precision.as_ref().unwrap(),
    );
    assert!(!f.raised.is_empty(), "{}", one.table());
    assert!(m.front.iter().filter(|p| p.accuracy.is_some()).count() >= 2);
    assert_eq!(analyze_on(2, &cfg, &request), one);
    // Each figure is the mean of the seeds' own: the chosen policy's accuracy and the
    // fallback's, measured here one seed at a time.
    let seed_alone = |seed: u64, policy: &quant::policy::Policy| {
        let mut c = cfg.clone();
        c.run.seeds = vec![seed];
        c.quantization = policy.clone();
        analyze_on(2, &c, &AnalyzeRequest::default())
            .mean
            .quantized
            .accuracy
    };
    for (policy, accuracy) in [(&m.policy, m.accuracy), (&f.policy, f.accuracy)] {
        let per_seed = [seed_alone(0, policy), seed_alone(1, policy)];
        assert_eq!((per_seed[0] + per_seed[1]) / 2.0, accuracy, "{per_seed:?}");
    }
}

fn drop_of(max_drop: f64) -> AnalyzeRequest {
    AnalyzeRequest {
        max_drop: Some(max_drop),
        ..AnalyzeRequest::default()
    }
}

fn budget_of(resource: Resource, bits: f64, candidates: &[u8]) -> AnalyzeRequest {
    AnalyzeRequest {
        budget: Some(PrecisionBudget {
            resource,
            bits,
            candidates: candidates.to_vec(),
        }),
        ..AnalyzeRequest::default()
    }
}

#[test]
fn mixed_precision_keeps_the_budget_and_its_policy_reproduces_its_accuracy() {
    let cfg = planted();
    let a = analyze(
        &cfg,
        &RunOptions::default(),
        &budget_of(Resource::Weights, 4.0, &[2, 4, 8]),
    )
    .unwrap();
    let m = a.mixed_precision.as_ref().unwrap();
    // The three Linear layers' weights, sized from the graph: 64x256, 256x256, 256x10.
    let sizes: Vec<usize> = m.slots.iter().map(|w| w.units as usize).collect();
    assert_eq!(sizes, [64 * 256, 256 * 256, 256 * 10], "{}", a.table());
    let total: usize = sizes.iter().sum();
    let bits: usize = m
        .slots
        .iter()
        .map(|w| w.units as usize * usize::from(w.bits))
        .sum();
    assert!(bits <= 4 * total && m.bits <= 4.0, "{}", a.table());
    assert!((m.bits - bits as f64 / total as f64).abs() < 1e-12);
    // More bits mean less noise at every slot, so the optimum spends the budget: no slot
    // could move to a wider candidate within it.
    for w in &m.slots {
        assert!(
            w.noise.windows(2).all(|n| n[0] > n[1]),
            "{}: {:?}",
            w.slot,
            w.noise
        );
        if let Some(&wider) = [2u8, 4, 8].iter().find(|&&b| b > w.bits) {
            let more = w.units as usize * usize::from(wider - w.bits);
            assert!(
                bits + more > 4 * total,
                "{} could take {wider} bits",
                w.slot
            );
        }
    }
    // The front runs from all 2-bit to all 8-bit with falling noise, the chosen point is on
    // it, and its ends have their accuracy measured, the 8-bit end the best.
    let (first, last) = (m.front.first().unwrap(), m.front.last().unwrap());
    assert!(
        (first.bits - 2.0).abs() < 1e-12 && (last.bits - 8.0).abs() < 1e-12,
        "{:?}",
        m.front
    );
    assert!(m.front.windows(2).all(|p| p[0].noise > p[1].noise));
    assert!(m.front.iter().any(|p| (p.bits - m.bits).abs() < 1e-12));
    // The ends' accuracies are measured; a measured point with the chosen widths has the
    // chosen policy's accuracy (the same policy, the same PTQ).
    assert!(first.accuracy.is_some() && last.accuracy.is_some());
    for p in &m.front {
        if let (Some(acc), true) = (p.accuracy, (p.bits - m.bits).abs() < 1e-12) {
            assert_eq!(acc, m.accuracy, "{}", a.table());
        }
    }
    let measured = m.front.iter().filter(|p| p.accuracy.is_some()).count();
    assert!((2..=9).contains(&measured), "{measured}");
    assert!(a.svg().contains("Mixed precision (Weights)"));
    // The policy, read back, gives the same PTQ accuracy.
    let text = toml::to_string(&m.policy).unwrap();
    let mut again = cfg.clone();
    again.quantization = quant::policy::Policy::from_toml_str(&text, "mixed.toml").unwrap();
    let again = analyze(&again, &RunOptions::default(), &AnalyzeRequest::default()).unwrap();
    assert_eq!(again.mean.quantized.accuracy, m.accuracy, "{text}");
    assert!(m.uniform_accuracy.is_some());
    // Budgets outside the candidates' range, empty or unsupported candidates: refused.
    for (bits, candidates, key) in [
        (1.5, &[2u8, 4, 8][..], "weight_budget"),
        (9.0, &[2, 4, 8][..], "weight_budget"),
        (f64::NAN, &[2, 4, 8][..], "weight_budget"),
        (4.0, &[][..], "candidates"),
        (4.0, &[1, 4][..], "candidates"),
        (4.0, &[4, 17][..], "candidates"),
    ] {
        let request = budget_of(Resource::Weights, bits, candidates);
        let e = analyze(&cfg, &RunOptions::default(), &request)
            .unwrap_err()
            .to_string();
        assert!(e.contains(key), "{bits} {candidates:?}: {e}");
    }
}

#[test]
fn bops_and_activation_budgets_count_their_units_and_keep_them() {
    let cfg = planted();
    // BOPs: multiply-adds times the 8-bit inputs; the same layers as the weights.
    let a = analyze(
        &cfg,
        &RunOptions::default(),
        &budget_of(Resource::Bops, 5.0, &[2, 4, 8]),
    )
    .unwrap();
    let m = a.mixed_precision.as_ref().unwrap();
    let units: Vec<u64> = m.slots.iter().map(|s| s.units).collect();
    assert_eq!(
        units,
        [64 * 256 * 8, 256 * 256 * 8, 256 * 10 * 8],
        "{}",
        a.table()
    );
    let spent: u64 = m.slots.iter().map(|s| s.units * u64::from(s.bits)).sum();
    assert!(spent <= 5 * units.iter().sum::<u64>(), "{}", a.table());
    // Activations: each Linear's input quantizer, counted in values per sample.
    let a = analyze(
        &cfg,
        &RunOptions::default(),
        &budget_of(Resource::Activations, 6.0, &[4, 8]),
    )
    .unwrap();
    let m = a.mixed_precision.as_ref().unwrap();
    let slots: Vec<(&str, u64)> = m.slots.iter().map(|s| (s.slot.as_str(), s.units)).collect();
    assert_eq!(
        slots,
        [("0.input", 64), ("2.input", 256), ("4.input", 256)],
        "{}",
        a.table()
    );
    let spent: u64 = m.slots.iter().map(|s| s.units * u64::from(s.bits)).sum();
    assert!(spent <= 6 * 576 && m.bits <= 6.0, "{}", a.table());
    // The policy gives those inputs those widths.
    let text = toml::to_string(&m.policy).unwrap();
    let mut again = cfg.clone();
    again.quantization = quant::policy::Policy::from_toml_str(&text, "acts.toml").unwrap();
    let again = analyze(&again, &RunOptions::default(), &AnalyzeRequest::default()).unwrap();
    assert_eq!(again.mean.quantized.accuracy, m.accuracy, "{text}");
    let e = analyze(
        &cfg,
        &RunOptions::default(),
        &budget_of(Resource::Activations, 9.0, &[4, 8]),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("activation_budget"), "{e}");
}

#[test]
fn the_fallback_can_raise_slots_to_8_bits_instead_of_float() {
    let cfg = harsh();
    let request = AnalyzeRequest {
        max_drop: Some(0.5),
        raise: Raise::Bits(8),
        ..AnalyzeRequest::default()
    };
    let a = analyze(&cfg, &RunOptions::default(), &request).unwrap();
    let f = a.fallback.as_ref().unwrap();
    let drop = |acc: f64| 100.0 * (a.mean.float_accuracy - acc);
    assert!(f.met && drop(f.accuracy) <= 0.5 + 1e-9, "{}", a.table());
    assert!(
        !f.raised.is_empty() && f.raised.len() < f.slots,
        "{}",
        a.table()
    );
    let ranked: Vec<&str> = a.mean.slots.iter().map(|s| s.slot.as_str()).collect();
    assert_eq!(f.raised, ranked[..f.raised.len()]);
    assert!(a.table().contains("raised to 8 bits"), "{}", a.table());
    // Each raised slot (all 2-bit weights or 8-bit inputs here) becomes 8 bits, or float when
    // already 8 bits wide: the overrides say so, in rank order.
    let added = &f.policy.overrides[f.policy.overrides.len() - f.raised.len()..];
    for (o, slot) in added.iter().zip(&f.raised) {
        let (name, setting) = o.slots.iter().next().unwrap();
        assert!(slot.ends_with(name.as_str()), "{slot} {name}");
        match (name.as_str(), setting) {
            ("weights", quant::policy::SlotSetting::Quantize(q)) => assert_eq!(q.bits, Some(8)),
            ("input", quant::policy::SlotSetting::Float) => {}
            other => panic!("{slot}: {other:?}"),
        }
    }
    // The policy file, read back, gives the same PTQ accuracy.
    let text = toml::to_string(&f.policy).unwrap();
    let mut again = cfg.clone();
    again.quantization = quant::policy::Policy::from_toml_str(&text, "raised.toml").unwrap();
    let again = analyze(&again, &RunOptions::default(), &AnalyzeRequest::default()).unwrap();
    assert_eq!(again.mean.quantized.accuracy, f.accuracy, "{text}");
    // A width no quantizer has is refused before anything trains.
    let bad = AnalyzeRequest {
        raise: Raise::Bits(17),
        ..request
    };
    let e = analyze(&cfg, &RunOptions::default(), &bad)
        .unwrap_err()
        .to_string();
    assert!(e.contains("raise_to"), "{e}");
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("quant-analyze-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn quant_analyze_prints_the_ranking_and_writes_json_and_svg() {
    let dir = scratch("cli");
    std::fs::write(dir.join("planted.toml"), PLANTED).unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_quant"))
            .args(["analyze", "planted.toml", "--no-cache", "--quiet"])
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap()
    };
    let o = run(&["--report", "a.json", "--plot", "a.svg"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let first = out
        .lines()
        .find(|l| l.trim_start().starts_with("1 "))
        .unwrap();
    assert!(first.contains("2.weights"), "{out}");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("a.json")).unwrap()).unwrap();
    assert_eq!(json["mean"]["slots"][0]["slot"], "2.weights");
    assert!(std::fs::read_to_string(dir.join("a.svg"))
        .unwrap()
        .starts_with("<svg"));
    let o = run(&["--max-drop", "0", "--policy-out", "fallback.toml"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let policy = std::fs::read_to_string(dir.join("fallback.toml")).unwrap();
    quant::policy::Policy::from_toml_str(&policy, "fallback.toml").unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("fallback (max_drop 0 points)"));

    // Outputs are checked before anything trains, and nothing is written on a refusal.
    std::fs::create_dir(dir.join("adir")).unwrap();
    for (args, expected) in [
        (&["--plot", "adir"][..], "adir"),
        (&["--report", "planted.toml"][..], "input of this run"),
        (&["--report", "b.json", "--plot", "b.json"][..], "same file"),
        (&["--max-drop", "-1", "--report", "b.json"][..], "max_drop"),
        (&["--max-drop", "NaN", "--report", "b.json"][..], "max_drop"),
    ] {
        let o = run(args);
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{e}");
        assert!(e.contains(expected), "{args:?}: {e}");
    }
    let o = run(&["--weight-budget", "3", "--policy-out", "mixed.toml"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let policy = std::fs::read_to_string(dir.join("mixed.toml")).unwrap();
    quant::policy::Policy::from_toml_str(&policy, "mixed.toml").unwrap();
    assert!(String::from_utf8_lossy(&o.stdout)
        .contains("mixed precision (Weights: at most 3 bits per unit"));
    // `quant run --policy` quantizes with the written policy instead of the run file's.
    let o = Command::new(env!("CARGO_BIN_EXE_quant"))
        .args([
            "run",
            "planted.toml",
            "--policy",
            "mixed.toml",
            "--no-cache",
            "--quiet",
        ])
        .args(["--report", "r.json", "--out", "export"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("r.json")).unwrap()).unwrap();
    assert!(
        r["policy"]
            .as_str()
            .unwrap()
            .ends_with("with the policy mixed.toml"),
        "{r}"
    );
    let widths: Vec<u64> = r["layers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|l| l["quantizers"].as_array().unwrap().iter())
        .filter(|q| q["slot"] == "weights")
        .map(|q| q["bits"].as_u64().unwrap())
        .collect();
    let chosen: Vec<u64> = policy
        .lines()
        .filter_map(|l| l.trim().strip_prefix("bits = "))
        .map(|b| b.parse().unwrap())
        .collect();
    assert!(
        chosen.len() >= 3 && chosen.ends_with(&widths),
        "{widths:?} vs {chosen:?}"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_quant"))
        .args(["run", "planted.toml", "--policy", "missing.toml", "--quiet"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing.toml"));
    let o = run(&[
        "--weight-budget",
        "3",
        "--max-drop",
        "1",
        "--policy-out",
        "b.json",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("exactly one of them"));
    // --raise-to takes `float` or a bit width, and only with --max-drop.
    let o = run(&["--max-drop", "1", "--raise-to", "1"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("bit width from 2 to 16"));
    let o = run(&["--raise-to", "8"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--max-drop"));
    // A policy file without a fallback to write is a usage error.
    let o = run(&["--policy-out", "b.json"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("exactly one of them"));
    assert!(!dir.join("b.json").exists());
    assert_eq!(
        std::fs::read_to_string(dir.join("planted.toml")).unwrap(),
        PLANTED
    );
    std::fs::remove_dir_all(&dir).ok();
}

mod mixed_precision {
    use proptest::prelude::*;
    use quant::pipeline::mixed_precision::{pareto_front, solve, Choice, SolveError};

    /// Every assignment of one choice per slot, by counting in mixed radix.
    fn brute_force(slots: &[Vec<Choice>], budget: u64) -> Option<(u64, f64)> {
        let mut best: Option<(u64, f64)> = None;
        let total: usize = slots.iter().map(Vec::len).product();
        for mut k in 0..total {
            let (mut cost, mut loss) = (0u64, 0f64);
            for choices in slots {
                let c = choices[k % choices.len()];
                k /= choices.len();
                cost += c.cost;
                loss += c.loss;
            }
            if cost <= budget && best.is_none_or(|(_, l)| loss < l) {
                best = Some((cost, loss));
            }
        }
        best
    }

    fn slots() -> impl Strategy<Value = Vec<Vec<Choice>>> {
        let choice = (1u8..=8, 0u64..50, 0.0f64..10.0).prop_map(|(bits, cost, loss)| Choice {
            bits,
            cost,
            loss,
        });
        prop::collection::vec(prop::collection::vec(choice, 1..=3), 1..=8)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn the_solver_equals_brute_force_and_keeps_the_budget(slots in slots(), budget in 0u64..400) {
            match (solve(&slots, budget), brute_force(&slots, budget)) {
                (Ok(a), Some((_, loss))) => {
                    prop_assert!(a.cost <= budget);
                    prop_assert!((a.loss - loss).abs() < 1e-9, "{} vs {}", a.loss, loss);
                    // The choices it reports add up to what it says.
                    let (c, l) = a.choices.iter().zip(&slots).fold((0u64, 0f64), |(c, l), (&i, s)| {
                        (c + s[i].cost, l + s[i].loss)
                    });
                    prop_assert_eq!(c, a.cost);
                    prop_assert!((l - a.loss).abs() < 1e-9);
                }
                (Err(SolveError::BelowSmallest { .. }), None) => {}
                (got, want) => prop_assert!(false, "solver {:?}, brute force {:?}", got, want),
            }
            // The front: cheapest first, loss strictly falling, every entry within reach.
            let front = pareto_front(&slots, u64::MAX).unwrap();
            prop_assert!(front.windows(2).all(|w| w[0].cost < w[1].cost && w[0].loss > w[1].loss));
        }
    }

    #[test]
    fn empty_candidates_and_bad_losses_are_refused() {
        let ok = Choice {
            bits: 4,
            cost: 1,
            loss: 0.5,
        };
        assert_eq!(
            solve(&[vec![ok], vec![]], 10),
            Err(SolveError::NoChoices { slot: 1 })
        );
        let nan = Choice {
            loss: f64::NAN,
            ..ok
        };
        assert!(matches!(
            solve(&[vec![ok, nan]], 10),
            Err(SolveError::BadLoss {
                slot: 0,
                choice: 1,
                ..
            })
        ));
        assert_eq!(
            solve(&[vec![ok], vec![ok]], 1),
            Err(SolveError::BelowSmallest {
                budget: 1,
                smallest: 2
            })
        );
    }
}
