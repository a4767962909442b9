//! The kinds farm.example.com/v1alpha serves.

pub mod llama;

pub use llama::{Llama, LlamaSpec};
