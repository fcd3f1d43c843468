//! Helpers shared by the engine's test binaries.
#![allow(dead_code)]

use std::path::PathBuf;

use decide_engine::DeviceSpec;

/// The devices this build can test on: the CPU always, a GPU when its backend is compiled in
/// (one test body runs on each).
pub fn devices() -> Vec<DeviceSpec> {
    let mut d = vec![DeviceSpec::Cpu];
    if cfg!(feature = "cuda") {
        d.push(DeviceSpec::Cuda(0));
    }
    if cfg!(feature = "metal") {
        d.push(DeviceSpec::Metal);
    }
    d
}

/// Tolerance of a device: GPU kernels sum in other orders than the CPU.
pub fn tolerance(device: DeviceSpec) -> f32 {
    match device {
        DeviceSpec::Cpu => 1e-4,
        _ => 2e-3,
    }
}

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// `a` and `b` agree to `rel` of their magnitude; scores near zero (a cosine of 0.0006) are
/// held to `rel` of 0.01 instead, where a relative error means nothing.
pub fn relative_close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-2)
}
