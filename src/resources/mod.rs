//! The kinds farm.example.com/v1alpha serves.

pub mod farmpod;
pub mod llama;

pub use farmpod::{FarmPod, FarmPodSpec, FarmPodStatus};
pub use llama::{Llama, LlamaSpec};
