//! The observer a policy file names: parsing, errors that list what is valid, display and
//! round trips.

use super::*;

#[derive(Debug, Deserialize, Serialize, PartialEq)]
struct Policy {
    observer: ObserverConfig,
}

fn parse(toml_value: &str) -> Result<ObserverConfig, String> {
    toml::from_str::<Policy>(&format!("observer = {toml_value}"))
        .map(|p| p.observer)
        .map_err(|e| e.to_string())
}

#[test]
fn config_from_bare_names_and_tables() {
    for kind in [
        "MinMax",
        "MovingAverageMinMax",
        "Percentile",
        "Mse",
        "Entropy",
        "LsqInit",
    ] {
        let c = parse(&format!("\"{kind}\"")).unwrap();
        assert_eq!(c, ObserverConfig::from_kind(kind).unwrap());
        assert_eq!(c.to_string(), kind);
        assert_eq!(kind.parse::<ObserverConfig>().unwrap(), c);
        assert_eq!(parse(&format!("{{ kind = \"{kind}\" }}")).unwrap(), c);
    }
    assert_eq!(
        parse(r#"{ kind = "Percentile", percentile = 99.9 }"#).unwrap(),
        ObserverConfig::Percentile {
            percentile: Percentile::new(99.9).unwrap(),
            bins: HistogramBins::DEFAULT
        }
    );
    assert_eq!(
        parse(r#"{ kind = "MovingAverageMinMax", momentum = 0.05 }"#).unwrap(),
        ObserverConfig::MovingAverageMinMax {
            momentum: Momentum::new(0.05).unwrap()
        }
    );
    assert_eq!(
        parse(r#"{ kind = "Entropy", bins = 1024 }"#).unwrap(),
        ObserverConfig::Entropy { bins: bins(1024) }
    );
    // Integers are numbers too; JSON works the same way.
    assert_eq!(
        parse(r#"{ kind = "Percentile", percentile = 99, bins = 512 }"#)
            .unwrap()
            .to_string(),
        "Percentile(percentile = 99, bins = 512)"
    );
    let c: ObserverConfig = serde_json::from_str(r#"{"bins": 64, "kind": "Mse"}"#).unwrap();
    assert_eq!(c, ObserverConfig::Mse { bins: bins(64) });
}

#[test]
fn config_errors_list_what_is_valid() {
    let cases = [
        (
            r#""Histogram""#,
            "valid kinds: MinMax, MovingAverageMinMax, Percentile, Mse, Entropy, LsqInit",
        ),
        (r#""minmax""#, "observer kind = `minmax` is invalid"),
        (
            r#"{ kind = "Percentile", momentum = 0.1 }"#,
            "observer `Percentile` has no option `momentum`; valid options: kind, percentile, bins",
        ),
        (
            r#"{ kind = "MinMax", bins = 10 }"#,
            "observer `MinMax` has no option `bins`; it takes no options",
        ),
        (
            r#"{ kind = "Percentile", percentile = 120 }"#,
            "percentile = 120 is invalid: a number in (50, 100]",
        ),
        (
            r#"{ kind = "Percentile", percentile = 50 }"#,
            "a number in (50, 100]",
        ),
        (
            r#"{ kind = "MovingAverageMinMax", momentum = 0.0 }"#,
            "momentum = 0 is invalid: a number in (0, 1]",
        ),
        (
            r#"{ kind = "MovingAverageMinMax", momentum = 1.5 }"#,
            "a number in (0, 1]",
        ),
        (
            r#"{ kind = "Entropy", bins = 4 }"#,
            "bins = 4 is invalid: an integer in 8..=65536",
        ),
        (
            r#"{ kind = "Entropy", bins = -1 }"#,
            "an integer in 8..=65536",
        ),
        (
            r#"{ kind = "Entropy", bins = 2048.5 }"#,
            "`bins` must be an integer",
        ),
        (
            r#"{ kind = "Percentile", percentile = "high" }"#,
            "`percentile` must be a number, not a string",
        ),
        (
            r#"{ percentile = 99.0 }"#,
            "needs a `kind` key; valid kinds: MinMax",
        ),
        (r#"{ kind = 3 }"#, "observer `kind` must be one of MinMax"),
        ("3", "an observer: one of MinMax"),
    ];
    for (input, expected) in cases {
        let err = parse(input).unwrap_err();
        assert!(err.contains(expected), "{input}: {err}");
    }
    let err = serde_json::from_str::<ObserverConfig>(r#"{"kind": "Mse", "bins": 16, "bins": 32}"#)
        .unwrap_err();
    assert!(err.to_string().contains("duplicate key `bins`"), "{err}");
    let err = "Histogram".parse::<ObserverConfig>().unwrap_err();
    assert!(matches!(err, QuantError::InvalidValue { .. }), "{err}");
    // The option types validate in code too.
    assert!(Percentile::new(f64::NAN).is_err());
    assert!(Momentum::new(-0.1).is_err());
    assert!(HistogramBins::new(1 << 17).is_err());
}

#[test]
fn config_display_and_round_trip() {
    let configs = [
        ObserverConfig::MinMax,
        ObserverConfig::MovingAverageMinMax {
            momentum: Momentum::new(0.05).unwrap(),
        },
        ObserverConfig::Percentile {
            percentile: Percentile::new(99.9).unwrap(),
            bins: HistogramBins::DEFAULT,
        },
        ObserverConfig::Percentile {
            percentile: Percentile::DEFAULT,
            bins: bins(512),
        },
        ObserverConfig::Mse { bins: bins(256) },
        ObserverConfig::Entropy {
            bins: HistogramBins::DEFAULT,
        },
        ObserverConfig::LsqInit,
    ];
    let shown: Vec<String> = configs.iter().map(|c| c.to_string()).collect();
    assert_eq!(
        shown,
        [
            "MinMax",
            "MovingAverageMinMax(momentum = 0.05)",
            "Percentile(percentile = 99.9)",
            "Percentile(bins = 512)",
            "Mse(bins = 256)",
            "Entropy",
            "LsqInit"
        ]
    );
    for c in configs {
        let policy = Policy { observer: c };
        let text = toml::to_string(&policy).unwrap();
        assert_eq!(toml::from_str::<Policy>(&text).unwrap(), policy, "{text}");
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(
            serde_json::from_str::<ObserverConfig>(&json).unwrap(),
            c,
            "{json}"
        );
        assert_eq!(c.build().config(), c);
    }
    assert_eq!(
        serde_json::to_string(&ObserverConfig::Entropy {
            bins: HistogramBins::DEFAULT
        })
        .unwrap(),
        "\"Entropy\""
    );
}
