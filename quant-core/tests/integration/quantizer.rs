//! Channel layouts around an axis, and per-channel ranges that skip non-finite values.

use quant_core::{ChannelLayout, IntegerGrid, QuantError, QuantizerInput};

#[test]
fn layout_around_axis() {
    let l = ChannelLayout::new(&[2, 3, 4], Some(1)).unwrap();
    assert_eq!((l.outer, l.channels, l.inner), (2, 3, 4));
    assert_eq!(l.channel_of(5), 1);
    assert_eq!(l.channel_of(12), 0);
    assert_eq!(ChannelLayout::new(&[2, 3], None).unwrap().numel(), 6);
    assert!(matches!(
        ChannelLayout::new(&[2, 3], Some(2)),
        Err(QuantError::InvalidAxis { axis: 2, rank: 2 })
    ));
    assert!(ChannelLayout::new(&[usize::MAX, 3], None).is_err());
}

#[test]
fn channel_ranges_skip_non_finite() {
    let data = [1.0, -2.0, f32::NAN, 4.0, f32::INFINITY, 0.5];
    let x = QuantizerInput::new(
        &data,
        ChannelLayout::new(&[2, 3], Some(0)).unwrap(),
        IntegerGrid::INT8,
    )
    .unwrap();
    let (mins, maxs) = x.channel_ranges();
    assert_eq!(mins, vec![-2.0, 0.5]);
    assert_eq!(maxs, vec![1.0, 4.0]);
}
