//! The AVX-VNNI path's kernels (256-bit registers, 6-row tiles) on CPUs without AVX-VNNI: the
//! same instructions in their AVX-512 VL encoding run the same tiles on the same packing, so
//! everything but the instruction encoding is checked on AVX-512 VNNI machines too.

use quant_core::__internals::gemm_u8_on_avx_vnni_tiles_in_evex;
use quant_core::int8::{gemm_u8, Isa, PackedMatrix};

#[test]
fn avx_vnni_tiles_match_the_portable_path() {
    for (max_w, k, m, n) in [
        (64, 37, 13, 19),
        (64, 144, 6, 8),
        (300, 33, 7, 17),
        (127, 9, 1, 1),
    ] {
        let w: Vec<i32> = (0..n * k)
            .map(|i| (i as i32 * 7919) % (2 * max_w + 1) - max_w)
            .collect();
        let a: Vec<u8> = (0..m * k).map(|i| (i * 104_729 % 256) as u8).collect();
        let bias: Vec<i32> = (0..n as i32).map(|o| o * 31 - 100).collect();
        let portable = PackedMatrix::with_isa(&w, n, k, Isa::Portable).unwrap();
        let mut expected = vec![0; m * n];
        gemm_u8(&a, m, 5, &portable, &bias, &mut expected).unwrap();
        if !Isa::Avx2.is_available() {
            eprintln!("note: no AVX2: the AVX-VNNI tiles are not checked here");
            return;
        }
        // AVX2 packs 8-lane panels: quads for |w| <= 64, pairs beyond, as AVX-VNNI does.
        let packed = PackedMatrix::with_isa(&w, n, k, Isa::Avx2).unwrap();
        let mut out = vec![0; m * n];
        if gemm_u8_on_avx_vnni_tiles_in_evex(&a, m, 5, &packed, &bias, &mut out).is_none() {
            eprintln!("note: no AVX-512 VNNI + VL: the AVX-VNNI tiles are not checked here");
            return;
        }
        assert_eq!(out, expected, "|w| <= {max_w}, k = {k}, {m}x{n}");
    }
}
