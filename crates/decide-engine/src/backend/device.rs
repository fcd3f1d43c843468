//! Where the model runs and in which precision.

use std::fmt;
use std::str::FromStr;

use candle_core::{DType, Device};

use crate::error::{first_line, EngineError, Result};

/// A device as the user names it: `cpu`, `cuda`, `cuda:N`, `metal` or `auto`.
///
/// A backend that was not compiled in is an error when the device is opened, never a silent
/// fallback to another device: `auto` is the only spec that picks for the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    /// The CPU (the default).
    #[default]
    Cpu,
    /// An NVIDIA GPU by ordinal (needs the `cuda` feature).
    Cuda(usize),
    /// The Apple GPU (needs the `metal` feature).
    Metal,
    /// The first of CUDA, Metal and CPU that this build and machine can open.
    Auto,
}

impl FromStr for DeviceSpec {
    type Err = EngineError;

    fn from_str(s: &str) -> Result<Self> {
        let lower = s.trim().to_ascii_lowercase();
        match lower.as_str() {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" | "gpu" => Ok(DeviceSpec::Cuda(0)),
            "metal" | "mps" => Ok(DeviceSpec::Metal),
            "auto" => Ok(DeviceSpec::Auto),
            other => match other.strip_prefix("cuda:") {
                Some(n) => n
                    .parse()
                    .map(DeviceSpec::Cuda)
                    .map_err(|_| EngineError::Device {
                        device: s.to_string(),
                        message: "the CUDA ordinal must be a number, as in cuda:0".into(),
                    }),
                None => Err(EngineError::Device {
                    device: s.to_string(),
                    message: "expected cpu, cuda, cuda:N, metal or auto".into(),
                }),
            },
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
            DeviceSpec::Metal => f.write_str("metal"),
            DeviceSpec::Auto => f.write_str("auto"),
        }
    }
}

impl DeviceSpec {
    /// Opens the device.
    pub fn open(self) -> Result<Device> {
        let fail = |e: candle_core::Error| EngineError::Device {
            device: self.to_string(),
            message: first_line(&e.to_string()),
        };
        let not_built = |feature: &str, how: &str| EngineError::Device {
            device: self.to_string(),
            message: format!(
                "this build has no {feature} backend: build with `--features {feature}`{how}"
            ),
        };
        match self {
            DeviceSpec::Cpu => Ok(Device::Cpu),
            DeviceSpec::Cuda(_) if !cfg!(feature = "cuda") => Err(not_built(
                "cuda",
                " (scripts/build-cuda does it with CUDA from PyPI)",
            )),
            DeviceSpec::Cuda(n) => Device::new_cuda(n).map_err(fail),
            DeviceSpec::Metal if !cfg!(feature = "metal") => Err(not_built("metal", " on macOS")),
            DeviceSpec::Metal => Device::new_metal(0).map_err(fail),
            DeviceSpec::Auto => {
                if candle_core::utils::cuda_is_available() {
                    if let Ok(d) = Device::new_cuda(0) {
                        return Ok(d);
                    }
                }
                if candle_core::utils::metal_is_available() {
                    if let Ok(d) = Device::new_metal(0) {
                        return Ok(d);
                    }
                }
                Ok(Device::Cpu)
            }
        }
    }
}

/// The precision of the weights and activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// 32-bit floats: the default.
    #[default]
    F32,
    /// The CPU's int8 path: the linear layers' weights quantized to int8 per output channel at
    /// load, their inputs to u8 per row at run time, products accumulated in i32 (AVX-512 VNNI
    /// where the CPU has it); attention, LayerNorm, GELU and the head stay f32. Needs the fused
    /// CPU kernels.
    Int8,
    /// 16-bit floats (GPUs).
    F16,
    /// bfloat16. On a GPU, candle's bf16 tensors. On the CPU, the linear layers' weights and
    /// inputs rounded to bf16 and multiplied on AMX tiles with f32 sums (Intel Xeons since
    /// Sapphire Rapids; an error elsewhere); attention, LayerNorm, GELU and the head stay f32.
    /// Needs the fused CPU kernels.
    Bf16,
    /// The fastest precision that keeps the accuracy targets on this device (see
    /// [`resolve`](Self::resolve)): bf16 on a CPU with AMX and the fused kernels, f32 elsewhere.
    Auto,
}

/// Which code runs the encoder on the CPU (f32). Other devices always run candle's ops.
///
/// The fused kernels are chosen at load time: the instruction set comes from run-time CPU
/// detection and is never above what the CPU supports; the variants below only lower it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuKernels {
    /// The fused kernels at the widest instruction set this CPU has (AVX-512, AVX2+FMA or
    /// baseline): the default.
    #[default]
    Auto,
    /// The fused kernels at most at AVX-512, with the int8 products in registers (VNNI), not
    /// on AMX tiles: what a CPU of the same vector instructions without AMX runs (Xeons before
    /// Sapphire Rapids, AMD Zen 4 and 5). bf16, which is AMX only, still runs on the tiles.
    Avx512,
    /// The fused kernels at most at AVX2+FMA, the int8 products included: what a CPU without
    /// AVX-512 or VNNI runs.
    Avx2,
    /// The fused kernels at most at AVX2+FMA, with the int8 products on AVX-VNNI (256-bit
    /// `vpdpbusd`) where the CPU has it: what a CPU with AVX-VNNI and without AVX-512 runs
    /// (Intel's client cores since Alder Lake).
    AvxVnni,
    /// The fused kernels in baseline code only: what a CPU without AVX2 runs.
    Portable,
    /// candle's own ops, one per step: the reference path the fused kernels are tested against.
    Stock,
}

impl FromStr for CpuKernels {
    type Err = EngineError;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "fused" => Ok(CpuKernels::Auto),
            "avx512" | "avx-512" => Ok(CpuKernels::Avx512),
            "avx2" => Ok(CpuKernels::Avx2),
            "avx-vnni" | "avxvnni" => Ok(CpuKernels::AvxVnni),
            "portable" => Ok(CpuKernels::Portable),
            "stock" | "candle" => Ok(CpuKernels::Stock),
            _ => Err(EngineError::InvalidOption {
                option: "kernels",
                message: format!("'{s}': expected auto, avx512, avx2, avx-vnni, portable or stock"),
            }),
        }
    }
}

impl FromStr for Precision {
    type Err = EngineError;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(Precision::F32),
            "int8" | "i8" | "qint8" => Ok(Precision::Int8),
            "f16" | "float16" | "half" => Ok(Precision::F16),
            "bf16" | "bfloat16" => Ok(Precision::Bf16),
            "auto" => Ok(Precision::Auto),
            _ => Err(EngineError::InvalidOption {
                option: "dtype",
                message: format!("'{s}': expected f32, int8, f16, bf16 or auto"),
            }),
        }
    }
}

impl Precision {
    /// The precision `Auto` stands for with these kernels on `device`; any other is itself.
    ///
    /// On a CPU with AMX, bf16 (about 2.5× f32 there) keeps the accuracy targets against f32
    /// on every report part: the same best tool for 99.6% of the cases, recall@10 unchanged,
    /// the same tools passed for 99.1% (docs/benchmarks.md). int8 is as fast there but misses
    /// them (98.4% and 94.6%), and f32 is the only path elsewhere that keeps them.
    pub fn resolve(self, device: &Device, kernels: CpuKernels) -> Precision {
        match self {
            Precision::Auto
                if matches!(device, Device::Cpu)
                    && kernels != CpuKernels::Stock
                    && super::amx::Amx::detect().is_some() =>
            {
                Precision::Bf16
            }
            Precision::Auto => Precision::F32,
            other => other,
        }
    }

    /// The candle dtype, checked against the device: candle's CPU backend has no fast
    /// half-precision kernels, so f16 and bf16 tensors there would be slower than f32, not
    /// faster. Without AMX, an AVX512-BF16 dot product (`vdpbf16ps`) measured at 70% of the
    /// f32 FMA rate per core on Xeons, so a bf16 linear layer would not beat the f32 one: bf16
    /// on the CPU is the AMX kernels only, and an error on a CPU without them.
    ///
    /// int8 and bf16 on the CPU run f32 activations between their products: their dtype is
    /// f32.
    pub fn dtype_for(self, device: &Device) -> Result<DType> {
        match (self, device) {
            (Precision::F32 | Precision::Auto, _) => Ok(DType::F32),
            (Precision::Int8, Device::Cpu) => Ok(DType::F32),
            (Precision::Bf16, Device::Cpu) => match super::amx::Amx::detect() {
                Some(_) => Ok(DType::F32),
                None => Err(EngineError::InvalidOption {
                    option: "dtype",
                    message: super::kernels::BF16_NEEDS_AMX.into(),
                }),
            },
            (Precision::Int8, _) => Err(EngineError::InvalidOption {
                option: "dtype",
                message: "int8 runs on the cpu only (its kernels are CPU kernels); use f16 or \
                          bf16 on a GPU"
                    .into(),
            }),
            (_, Device::Cpu) => Err(EngineError::InvalidOption {
                option: "dtype",
                message: format!(
                    "{} is not available on the cpu (no half-precision CPU kernel is faster than \
                     f32 there); use f32, int8, bf16 (with AMX) or auto",
                    self.name()
                ),
            }),
            (Precision::F16, _) => Ok(DType::F16),
            (Precision::Bf16, _) => Ok(DType::BF16),
        }
    }

    /// The name as the command line spells it.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Int8 => "int8",
            Precision::F16 => "f16",
            Precision::Bf16 => "bf16",
            Precision::Auto => "auto",
        }
    }
}

/// The name of an opened device, for logs and reports.
pub fn device_name(device: &Device) -> String {
    match device {
        Device::Cpu => "cpu".into(),
        Device::Cuda(_) => "cuda".into(),
        Device::Metal(_) => "metal".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_device_specs() {
        assert_eq!("cpu".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
        assert_eq!("CUDA".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(0));
        assert_eq!("cuda:3".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(3));
        assert_eq!("metal".parse::<DeviceSpec>().unwrap(), DeviceSpec::Metal);
        assert_eq!("auto".parse::<DeviceSpec>().unwrap(), DeviceSpec::Auto);
        let err = "tpu".parse::<DeviceSpec>().unwrap_err().to_string();
        assert_eq!(
            err,
            "device 'tpu': expected cpu, cuda, cuda:N, metal or auto"
        );
        assert!("cuda:x".parse::<DeviceSpec>().is_err());
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn a_backend_that_is_not_compiled_in_is_an_error() {
        let err = DeviceSpec::Cuda(0).open().unwrap_err().to_string();
        assert!(err.starts_with("device 'cuda:0': "), "{err}");
        if !cfg!(feature = "cuda") {
            assert!(err.contains("build with `--features cuda`"), "{err}");
        }
        if !cfg!(feature = "metal") {
            let err = DeviceSpec::Metal.open().unwrap_err().to_string();
            assert!(err.contains("build with `--features metal`"), "{err}");
        }
    }

    #[test]
    fn auto_always_opens_something() {
        assert!(DeviceSpec::Auto.open().is_ok());
    }

    #[test]
    fn half_precision_is_refused_on_cpu() {
        assert_eq!(Precision::F32.dtype_for(&Device::Cpu).unwrap(), DType::F32);
        let err = Precision::F16
            .dtype_for(&Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(err.contains("f16 is not available on the cpu"), "{err}");
        // bf16 is the AMX kernels' (f32 activations between them), or a one-line error.
        match Precision::Bf16.dtype_for(&Device::Cpu) {
            Ok(dtype) => {
                assert!(crate::backend::amx::Amx::detect().is_some());
                assert_eq!(dtype, DType::F32);
            }
            Err(err) => {
                let err = err.to_string();
                assert!(err.contains("bf16 on the cpu needs AMX"), "{err}");
                assert!(!err.contains('\n'), "{err}");
            }
        }
        assert_eq!("BF16".parse::<Precision>().unwrap(), Precision::Bf16);
        assert!("fp8".parse::<Precision>().is_err());
        assert_eq!("auto".parse::<Precision>().unwrap(), Precision::Auto);
        assert_eq!(Precision::Auto.dtype_for(&Device::Cpu).unwrap(), DType::F32);
        // auto is bf16 on AMX with the fused kernels, f32 otherwise; the others are themselves.
        let amx = crate::backend::amx::Amx::detect().is_some();
        let want = if amx { Precision::Bf16 } else { Precision::F32 };
        assert_eq!(
            Precision::Auto.resolve(&Device::Cpu, CpuKernels::Auto),
            want
        );
        assert_eq!(
            Precision::Auto.resolve(&Device::Cpu, CpuKernels::Avx512),
            want
        );
        let stock = Precision::Auto.resolve(&Device::Cpu, CpuKernels::Stock);
        assert_eq!(stock, Precision::F32);
        for p in [
            Precision::F32,
            Precision::Int8,
            Precision::Bf16,
            Precision::F16,
        ] {
            assert_eq!(p.resolve(&Device::Cpu, CpuKernels::Auto), p);
        }
        assert_eq!("INT8".parse::<Precision>().unwrap(), Precision::Int8);
        assert_eq!(Precision::Int8.dtype_for(&Device::Cpu).unwrap(), DType::F32);
        assert_eq!(Precision::Int8.name(), "int8");
        let err = "fp8".parse::<Precision>().unwrap_err().to_string();
        assert!(
            err.contains("expected f32, int8, f16, bf16 or auto"),
            "{err}"
        );
    }

    #[test]
    fn parses_cpu_kernels() {
        assert_eq!("stock".parse::<CpuKernels>().unwrap(), CpuKernels::Stock);
        assert_eq!("AUTO".parse::<CpuKernels>().unwrap(), CpuKernels::Auto);
        assert_eq!(
            "portable".parse::<CpuKernels>().unwrap(),
            CpuKernels::Portable
        );
        let err = "amx".parse::<CpuKernels>().unwrap_err().to_string();
        assert!(
            err.contains("expected auto, avx512, avx2, avx-vnni, portable or stock"),
            "{err}"
        );
    }
}
