//! One kind's handler state, as every verb receives it.

use std::sync::Arc;

use super::{context::RestContext, field_managers};
use crate::{
    error::{Error, Result},
    resource::ServedResource,
    store::{Store, WritableStore},
};

/// What every handler of one kind reaches: its store, the context all kinds share, its field
/// managers and its versions.
pub(crate) struct KindApiInner<K> {
    pub(crate) store: Arc<dyn Store<K>>,
    pub(crate) ctx: RestContext,
    /// The kind's field managers (a kind whose schema does not convert is not served).
    pub(crate) fields: field_managers::FieldManagers,
    /// The kind's versions, for admission's `matchPolicy: Equivalent` (None: it has one).
    pub(crate) equivalents: Option<Arc<dyn crate::admission::Equivalents>>,
}

/// A kind's handler state: one `Arc`, so the per-request clone is one atomic increment.
pub(crate) struct KindApi<K>(Arc<KindApiInner<K>>);

impl<K> Clone for KindApi<K> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<K> std::ops::Deref for KindApi<K> {
    type Target = KindApiInner<K>;
    fn deref(&self) -> &KindApiInner<K> {
        &self.0
    }
}

impl<K> KindApi<K> {
    pub(crate) fn new(inner: KindApiInner<K>) -> Self {
        Self(Arc::new(inner))
    }
}

impl<K: ServedResource> KindApi<K> {
    /// The store's writes; 405 when the kind is read-only.
    pub(crate) fn writer(&self) -> Result<&dyn WritableStore<K>> {
        self.store.writable().ok_or_else(|| {
            Error::MethodNotAllowed(format!(
                "writes are not supported on resources of kind {:?}",
                K::qualified_resource()
            ))
        })
    }
}
