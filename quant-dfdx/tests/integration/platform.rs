//! The built-in platforms: registered, complete, found by name; an unknown name lists the valid ones.

use quant_dfdx::convert::LayerKind;
use quant_dfdx::platform::find_platform;

#[test]
fn built_in_platforms_are_registered_and_complete() {
    for name in ["Academic", "TensorRtInt8", "OpenVinoInt8", "GenericInt4"] {
        let p = find_platform(name).unwrap();
        assert_eq!(p.name, name);
        for s in [&p.weights, &p.input] {
            assert!(
                s.training_method.is_some()
                    && s.method.is_some()
                    && s.bits.is_some()
                    && s.observer.is_some()
            );
        }
    }
    let trt = find_platform("TensorRtInt8").unwrap();
    assert_eq!(trt.float_kinds, [LayerKind::LayerNorm, LayerKind::Gelu]);
    assert!(trt.attention.contains("softmax"));
    assert_eq!(trt.weights.narrow_range, Some(true));
    assert_eq!(trt.weights.per_channel, Some(true));
    let err = find_platform("TensorRT").unwrap_err().to_string();
    assert!(
        err.contains("Academic, GenericInt4, OpenVinoInt8, TensorRtInt8"),
        "{err}"
    );
}
