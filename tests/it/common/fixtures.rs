//! Typed test objects: a test states what differs from a valid default, and cannot misspell a
//! field (JSON built from the type is what a client such as kube-rs sends).

use farm_apiserver::resources::{Llama, LlamaSpec};

/// A valid Llama named `name` (31.4 kg, 0.5 m, no namespace), to adjust.
pub fn llama(name: &str) -> LlamaFixture {
    LlamaFixture(Llama::new(
        name,
        LlamaSpec {
            weight: 31.4,
            height: 0.5,
        },
    ))
}

/// A Llama being built; [`LlamaFixture::build`] or [`LlamaFixture::json`] ends it.
pub struct LlamaFixture(Llama);

impl LlamaFixture {
    pub fn weight(mut self, weight: f64) -> Self {
        self.0.spec.weight = weight;
        self
    }

    pub fn height(mut self, height: f64) -> Self {
        self.0.spec.height = height;
        self
    }

    pub fn namespace(mut self, namespace: &str) -> Self {
        self.0.metadata.namespace = Some(namespace.into());
        self
    }

    pub fn uid(mut self, uid: &str) -> Self {
        self.0.metadata.uid = Some(uid.into());
        self
    }

    pub fn build(self) -> Llama {
        self.0
    }

    /// The body a client sends to create it.
    pub fn json(self) -> String {
        serde_json::to_string(&self.0).expect("a Llama serializes")
    }
}
