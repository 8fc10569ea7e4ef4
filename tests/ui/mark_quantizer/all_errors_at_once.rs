use quant::prelude::*;

// Four problems, four errors: unknown target, unknown method, duplicated method, unknown key.
#[mark_quantizer(target = Wieghts, method = [Uniform, Linear, Uniform], id = Lsq, bits = 8)]
pub struct Q;

fn main() {}
