//! The twins of dfdx's composite modules: residual connections ([`QResidual`],
//! [`QGeneralizedResidual`]), [`QAddInto`], [`QSplitInto`] and [`QRepeated`], and the
//! [`AddQuantizer`] of their adds.
//!
//! An integer add needs both of its inputs on one grid (TensorRT's and OpenVINO's rule): the
//! add's `input` slot is one quantizer that quantizes both inputs, so calibration sees both
//! and they share a scale and zero point; the integer runtime then adds centered codes exactly.
//! The optional `output` slot quantizes the sum.

use dfdx::nn::tensor_collection::{ModuleVisitor, TensorCollection};
use dfdx::prelude::*;

use quant_core::dfdx_ops::{add, add_quantized, DynQuantization};
use quant_core::{QuantError, Result};

use super::{join_name, visit_layer_slots, QuantizedModule, Slot, SlotVisitor, TensorQuantizer};
use crate::convert::LayerKind;
use crate::lower::QuantizeNodes;
use quant_runtime::graph::{GraphBuilder, Op, ValueId};
use quant_runtime::GraphError;

/// The quantizers of an add: `input` (both operands, one grid) and the optional `output`.
#[derive(Debug, Clone)]
pub struct AddQuantizer<E: Dtype = f32, D: Storage<E> = Cpu> {
    /// Quantizes both inputs of the add.
    pub input_quantizer: TensorQuantizer<1, E, D>,
    /// Quantizes the sum (optional slot `output`).
    pub output_quantizer: TensorQuantizer<1, E, D>,
}

impl AddQuantizer {
    /// Unconfigured (pass-through) quantizers.
    pub fn new(dev: &Cpu) -> Self {
        AddQuantizer {
            input_quantizer: TensorQuantizer::new(dev),
            output_quantizer: TensorQuantizer::new(dev),
        }
    }

    /// `q(a) + q(b)`, then the output quantizer: the fake-quantized add (the sum is dfdx's,
    /// bit for bit, in plain passes: [`quant_core::dfdx_ops::add`]).
    ///
    /// # Errors
    /// The quantizers' errors.
    pub fn add<S: Shape, T: Tape<f32, Cpu> + Merge<T>>(
        &self,
        a: Tensor<S, f32, Cpu, T>,
        b: Tensor<S, f32, Cpu, T>,
    ) -> Result<Tensor<S, f32, Cpu, T>> {
        if let Some(quantizations) = self.input_quantizations(&a, &b)? {
            return self
                .output_quantizer
                .fake_quantize(add_quantized(a, b, quantizations)?);
        }
        let a = self.input_quantizer.fake_quantize(a)?;
        let b = self.input_quantizer.fake_quantize(b)?;
        self.output_quantizer.fake_quantize(add(a, b)?)
    }

    /// [`AddQuantizer::add`] for `forward_mut`: calibrating quantizers observe both inputs (one
    /// range covers both) and the sum.
    ///
    /// # Errors
    /// The quantizers' errors.
    pub fn add_mut<S: Shape, T: Tape<f32, Cpu> + Merge<T>>(
        &mut self,
        a: Tensor<S, f32, Cpu, T>,
        b: Tensor<S, f32, Cpu, T>,
    ) -> Result<Tensor<S, f32, Cpu, T>> {
        if let Some(quantizations) = self.input_quantizations(&a, &b)? {
            return self
                .output_quantizer
                .fake_quantize_mut(add_quantized(a, b, quantizations)?);
        }
        let a = self.input_quantizer.fake_quantize_mut(a)?;
        let b = self.input_quantizer.fake_quantize_mut(b)?;
        self.output_quantizer.fake_quantize_mut(add(a, b)?)
    }

    /// In training, the input quantizer's op on `a` and on `b`, for [`add_quantized`] to run
    /// inside the add (the same numbers, without tensors and zeroed gradient buffers for the
    /// quantized inputs); `None` without a tape or where the quantizer runs no op of its own
    /// (disabled, unconfigured, Calibrating).
    fn input_quantizations<S: Shape, T: Tape<f32, Cpu>>(
        &self,
        a: &Tensor<S, f32, Cpu, T>,
        b: &Tensor<S, f32, Cpu, T>,
    ) -> Result<Option<[DynQuantization; 2]>> {
        if !T::OWNS_TAPE {
            return Ok(None);
        }
        let a = self.input_quantizer.quantization(a.shape())?;
        let b = self.input_quantizer.quantization(b.shape())?;
        Ok(a.zip(b).map(|(a, b)| [a, b]))
    }

    /// Visits the two slots of the add of layer `name` (kind [`LayerKind::Add`]).
    ///
    /// # Errors
    /// The first error of `f`.
    pub fn visit_slots(&mut self, name: &str, f: &mut SlotVisitor<'_>) -> Result<()> {
        visit_layer_slots(
            name,
            LayerKind::Add,
            [
                (Slot::INPUT, &mut self.input_quantizer),
                (Slot::OUTPUT, &mut self.output_quantizer),
            ],
            f,
        )
    }

    /// Lowers the add of `a` and `b` as node `name`: a quantize node per input
    /// (`<name>.input.0`, `<name>.input.1`, both with the input quantizer), the add, and the
    /// output quantizer (`<name>.output`).
    ///
    /// # Errors
    /// A quantizer still calibrating, inputs of different shapes.
    pub fn lower(
        &self,
        name: &str,
        g: &mut GraphBuilder,
        a: ValueId,
        b: ValueId,
    ) -> Result<ValueId, GraphError> {
        let input = join_name(name, Slot::INPUT.name);
        let a = g.quantize_as(&join_name(&input, "0"), &input, &self.input_quantizer, a)?;
        let b = g.quantize_as(&join_name(&input, "1"), &input, &self.input_quantizer, b)?;
        let sum = g.add(name, Op::Add, &[a, b])?;
        g.quantize(
            &join_name(name, Slot::OUTPUT.name),
            &self.output_quantizer,
            sum,
        )
    }
}

tensor_collection! {
    impl[E: Dtype, D: Device<E>] AddQuantizer<E, D> => AddQuantizer<E2, D2>;
    AddQuantizer { input_quantizer, output_quantizer }
}

/// The twin of dfdx's `Residual<F>`: `x + F(x)`, the add quantized by an [`AddQuantizer`].
/// Names follow dfdx's: the module is `<name>.0`; the add is the layer `<name>`.
#[derive(Debug, Clone)]
pub struct QResidual<F, E: Dtype = f32, D: Storage<E> = Cpu> {
    /// The residual branch.
    pub module: F,
    /// The add's quantizers.
    pub add: AddQuantizer<E, D>,
}

/// The twin of dfdx's `GeneralizedResidual<F, R>`: `F(x) + R(x)` (R a projection shortcut),
/// the add quantized by an [`AddQuantizer`]. Names follow dfdx's: `<name>.f`, `<name>.r`; the
/// add is the layer `<name>`.
#[derive(Debug, Clone)]
pub struct QGeneralizedResidual<F, R, E: Dtype = f32, D: Storage<E> = Cpu> {
    /// The main branch.
    pub f: F,
    /// The shortcut.
    pub r: R,
    /// The add's quantizers.
    pub add: AddQuantizer<E, D>,
}

tensor_collection! {
    impl[E: Dtype, D: Device<E>, F: TensorCollection<E, D>] QResidual<F, E, D>
        => QResidual<F::To<E2, D2>, E2, D2>;
    QResidual { module as "0", add }
}

tensor_collection! {
    impl[E: Dtype, D: Device<E>, F: TensorCollection<E, D>, R: TensorCollection<E, D>]
        QGeneralizedResidual<F, R, E, D>
        => QGeneralizedResidual<F::To<E2, D2>, R::To<E2, D2>, E2, D2>;
    QGeneralizedResidual { f, r, add }
}

/// `Module` (evaluation) and `ModuleMut` (training and calibration) of the residuals and of
/// [`QRepeated`] run the same forward pass over the same branches; `(mut)` gives the method `&mut self`, and `add_mut` lets the add's
/// quantizers calibrate.
macro_rules! residual_modules {
    ($($trait:ident::$method:ident($($mut:ident)?) => $add:ident;)+) => {$(
        impl<S: Shape, T, F> $trait<Tensor<S, f32, Cpu, T>> for QResidual<F>
        where
            T: Tape<f32, Cpu> + Merge<T> + Default,
            F: $trait<Tensor<S, f32, Cpu, T>, Output = Tensor<S, f32, Cpu, T>>,
            F::Error: Into<QuantError>,
        {
            type Output = Tensor<S, f32, Cpu, T>;
            type Error = QuantError;

            fn $method(&$($mut)? self, x: Tensor<S, f32, Cpu, T>) -> Result<Self::Output> {
                let y = self.module.$method(x.with_empty_tape()).map_err(Into::into)?;
                self.add.$add(x, y)
            }
        }

        impl<S: Shape, O: Shape, T, F, R> $trait<Tensor<S, f32, Cpu, T>>
            for QGeneralizedResidual<F, R>
        where
            T: Tape<f32, Cpu> + Merge<T> + Default,
            F: $trait<Tensor<S, f32, Cpu, T>, Output = Tensor<O, f32, Cpu, T>>,
            R: $trait<Tensor<S, f32, Cpu, T>, Output = Tensor<O, f32, Cpu, T>>,
            F::Error: Into<QuantError>,
            R::Error: Into<QuantError>,
        {
            type Output = Tensor<O, f32, Cpu, T>;
            type Error = QuantError;

            fn $method(&$($mut)? self, x: Tensor<S, f32, Cpu, T>) -> Result<Self::Output> {
                let f = self.f.$method(x.with_empty_tape()).map_err(Into::into)?;
                let r = self.r.$method(x).map_err(Into::into)?;
                self.add.$add(f, r)
            }
        }

        impl<X, T, const N: usize> $trait<X> for QRepeated<T, N>
        where
            T: $trait<X, Output = X>,
            T::Error: Into<QuantError>,
        {
            type Output = X;
            type Error = QuantError;

            fn $method(&$($mut)? self, mut x: X) -> Result<X> {
                for m in &$($mut)? self.modules {
                    x = m.$method(x).map_err(Into::into)?;
                }
                Ok(x)
            }
        }
    )+};
}

residual_modules! {
    Module::try_forward() => add;
    ModuleMut::try_forward_mut(mut) => add_mut;
}

impl<F: QuantizedModule> QuantizedModule for QResidual<F> {
    fn visit_slots(&mut self, name: &str, f: &mut SlotVisitor<'_>) -> Result<()> {
        self.module.visit_slots(&join_name(name, "0"), f)?;
        self.add.visit_slots(name, f)
    }

    fn lower(&self, name: &str, g: &mut GraphBuilder, x: ValueId) -> Result<ValueId, GraphError> {
        let y = self.module.lower(&join_name(name, "0"), g, x)?;
        self.add.lower(name, g, x, y)
    }
}

impl<F: QuantizedModule, R: QuantizedModule> QuantizedModule for QGeneralizedResidual<F, R> {
    fn visit_slots(&mut self, name: &str, f: &mut SlotVisitor<'_>) -> Result<()> {
        self.f.visit_slots(&join_name(name, "f"), f)?;
        self.r.visit_slots(&join_name(name, "r"), f)?;
        self.add.visit_slots(name, f)
    }

    fn lower(&self, name: &str, g: &mut GraphBuilder, x: ValueId) -> Result<ValueId, GraphError> {
        let a = self.f.lower(&join_name(name, "f"), g, x)?;
        let b = self.r.lower(&join_name(name, "r"), g, x)?;
        self.add.lower(name, g, a, b)
    }
}

/// The twin of dfdx's `Repeated<T, N>`: `N` modules in sequence, named `<name>.0` to
/// `<name>.{N-1}` as dfdx names them.
#[derive(Debug, Clone)]
pub struct QRepeated<T, const N: usize> {
    /// The modules, in order.
    pub modules: Vec<T>,
}

impl<E: Dtype, D: Device<E>, T: TensorCollection<E, D>, const N: usize> TensorCollection<E, D>
    for QRepeated<T, N>
{
    type To<E2: Dtype, D2: Device<E2>> = QRepeated<T::To<E2, D2>, N>;

    fn iter_tensors<V: ModuleVisitor<Self, E, D>>(
        visitor: &mut V,
    ) -> std::result::Result<Option<Self::To<V::E2, V::D2>>, V::Err> {
        let names: Vec<String> = (0..N).map(|i| i.to_string()).collect();
        visitor.visit_fields(
            names
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    Self::module(name, move |s| &s.modules[i], move |s| &mut s.modules[i])
                })
                .collect::<Vec<_>>(),
            |modules| QRepeated { modules },
        )
    }
}

impl<T: QuantizedModule, const N: usize> QuantizedModule for QRepeated<T, N> {
    fn visit_slots(&mut self, name: &str, f: &mut SlotVisitor<'_>) -> Result<()> {
        for (i, m) in self.modules.iter_mut().enumerate() {
            m.visit_slots(&join_name(name, &i.to_string()), f)?;
        }
        Ok(())
    }

    fn lower(
        &self,
        name: &str,
        g: &mut GraphBuilder,
        mut x: ValueId,
    ) -> Result<ValueId, GraphError> {
        for (i, m) in self.modules.iter().enumerate() {
            x = m.lower(&join_name(name, &i.to_string()), g, x)?;
        }
        Ok(x)
    }
}

/// The twin of dfdx's `SplitInto<T>`: each module of the tuple `T` on the same input, giving
/// the tuple of their outputs. Names follow dfdx's: `<name>.0.<i>`.
#[derive(Debug, Clone)]
pub struct QSplitInto<T>(pub T);

/// The twin of dfdx's `AddInto<T>`: module `i` of the tuple `T` on element `i` of a tuple
/// input, the outputs added with one [`AddQuantizer`] (all of them on its grid). Names follow
/// dfdx's: `<name>.0.<i>`; the add is the layer `<name>`.
#[derive(Debug, Clone)]
pub struct QAddInto<T, E: Dtype = f32, D: Storage<E> = Cpu> {
    /// The modules.
    pub modules: T,
    /// The add's quantizers.
    pub add: AddQuantizer<E, D>,
}

tensor_collection! {
    impl[E: Dtype, D: Device<E>, T: TensorCollection<E, D>] QSplitInto<T> => QSplitInto<T::To<E2, D2>>;
    QSplitInto(0 as "0")
}

tensor_collection! {
    impl[E: Dtype, D: Device<E>, T: TensorCollection<E, D>] QAddInto<T, E, D>
        => QAddInto<T::To<E2, D2>, E2, D2>;
    QAddInto { modules as "0", add }
}

/// `Module` (evaluation) and `ModuleMut` (training and calibration) of [`QSplitInto`] and
/// [`QAddInto`] for one tuple arity: the same forward pass, `(mut)` giving the method `&mut self`
/// and `$add` naming the add's method (`add_mut` lets its quantizers calibrate).
macro_rules! split_add_modules {
    ($trait:ident::$method:ident($($mut:ident)?) => $add:ident; $([$m:ident $i:tt $x:ident])+) => {
        impl<X: WithEmptyTape, $($m: $trait<X>),+> $trait<X> for QSplitInto<($($m,)+)>
        where
            $($m::Error: Into<QuantError>,)+
        {
            type Output = ($($m::Output,)+);
            type Error = QuantError;

            fn $method(&$($mut)? self, x: X) -> Result<Self::Output> {
                Ok(($(self.0.$i.$method(x.with_empty_tape()).map_err(Into::into)?,)+))
            }
        }

        impl<S: Shape, T: Tape<f32, Cpu> + Merge<T>, $($x,)+ $($m),+> $trait<($($x,)+)>
            for QAddInto<($($m,)+)>
        where
            $($m: $trait<$x, Output = Tensor<S, f32, Cpu, T>>, $m::Error: Into<QuantError>,)+
        {
            type Output = Tensor<S, f32, Cpu, T>;
            type Error = QuantError;

            fn $method(&$($mut)? self, x: ($($x,)+)) -> Result<Self::Output> {
                let ys = ($(self.modules.$i.$method(x.$i).map_err(Into::into)?,)+);
                add_all!(self.add, $add, ys, $($i)+)
            }
        }
    };
}

macro_rules! split_add_impls {
    ($n:literal; $([$m:ident $i:tt $x:ident])+) => {
        split_add_modules!(Module::try_forward() => add; $([$m $i $x])+);
        split_add_modules!(ModuleMut::try_forward_mut(mut) => add_mut; $([$m $i $x])+);

        impl<$($m: QuantizedModule),+> QuantizedModule for QSplitInto<($($m,)+)> {
            fn visit_slots(&mut self, name: &str, f: &mut SlotVisitor<'_>) -> Result<()> {
                $(self.0.$i.visit_slots(&join_name(name, concat!("0.", stringify!($i))), f)?;)+
                Ok(())
            }

            fn lower(&self, name: &str, _g: &mut GraphBuilder, _x: ValueId) -> Result<ValueId, GraphError> {
                Err(tuple_value(name, "SplitInto gives", $n))
            }

            fn lower_values(&self, name: &str, g: &mut GraphBuilder, xs: &[ValueId]) -> Result<Vec<ValueId>, GraphError> {
                let [x] = xs else {
                    return Err(tuple_value(name, "SplitInto takes one value; it receives", xs.len()));
                };
                Ok(vec![$(self.0.$i.lower(&join_name(name, concat!("0.", stringify!($i))), g, *x)?,)+])
            }
        }

        impl<$($m: QuantizedModule),+> QuantizedModule for QAddInto<($($m,)+)> {
            fn visit_slots(&mut self, name: &str, f: &mut SlotVisitor<'_>) -> Result<()> {
                $(self.modules.$i.visit_slots(&join_name(name, concat!("0.", stringify!($i))), f)?;)+
                self.add.visit_slots(name, f)
            }

            fn lower(&self, name: &str, _g: &mut GraphBuilder, _x: ValueId) -> Result<ValueId, GraphError> {
                Err(tuple_value(name, "AddInto takes", $n))
            }

            fn lower_values(&self, name: &str, g: &mut GraphBuilder, xs: &[ValueId]) -> Result<Vec<ValueId>, GraphError> {
                if xs.len() != $n {
                    return Err(tuple_value(name, "AddInto takes", $n));
                }
                let ys = [$(self.modules.$i.lower(&join_name(name, concat!("0.", stringify!($i))), g, xs[$i])?,)+];
                let mut sum = ys[0];
                for (k, y) in ys.iter().enumerate().skip(1) {
                    let node = if k + 1 == ys.len() { name.to_string() } else { join_name(name, &format!("sum{k}")) };
                    sum = self.add.lower(&node, g, sum, *y)?;
                }
                Ok(vec![sum])
            }
        }
    };
}

/// `q(y0) + q(y1) + ...` with the add's quantizers, left to right.
macro_rules! add_all {
    ($add:expr, $method:ident, $ys:ident, $first:tt $($rest:tt)+) => {{
        let sum = $ys.$first;
        $(let sum = $add.$method(sum, $ys.$rest)?;)+
        Ok(sum)
    }};
}

fn tuple_value(name: &str, what: &str, n: usize) -> GraphError {
    GraphError::Unsupported {
        layer: name.to_string(),
        reason: format!("{what} {n} values; lower it inside a tuple that gives it what it takes (SplitInto then AddInto)"),
    }
}

split_add_impls!(2; [A 0 XA] [B 1 XB]);
split_add_impls!(3; [A 0 XA] [B 1 XB] [C 2 XC]);
split_add_impls!(4; [A 0 XA] [B 1 XB] [C 2 XC] [D 3 XD]);
